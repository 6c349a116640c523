"""The model families' plug-ins, one folder each (llamagen, continuous, unified): how a family's
manifest is checked, its pipeline opened, described and served. They sit above the pipeline they
build on; runtime/family_registry.py, below the pipeline, maps a manifest's "family" to them by
dotted path, so nothing here is imported until a bundle of its family is opened."""
