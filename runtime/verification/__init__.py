"""Verification of drafted tokens: which drafts a target keeps and what it samples instead.

Every acceptance and resampling formula of the speculative methods is written once here
(DESIGN.md "Methods" and the papers define them); the decoding methods (runtime/methods/) and
the device rounds (runtime/rounds/) only orchestrate model calls around these modules:
formulas (per-token formulas and Cool-SD's schedules), rules (what one drafted position is
tested with), chains, positions, siblings and trees (what is verified at once), transport (device
rows read to the host loop) and theory (Cool-SD's Theorem-2 estimates).
"""
