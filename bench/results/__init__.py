"""Committed outputs of the default `specrt bench` run on the demo (read by --profile-arch)."""
