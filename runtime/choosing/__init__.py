"""`--method auto`: choosing the fastest setting that keeps the user's guarantee, on their device.

candidates.py lists the settings the family's methods declare, probe.py measures the cost
model's terms for each on the user's pipeline, choose.py predicts (runtime/cost_model.py) and
picks, cache.py keeps the choice on disk."""
from specrt.runtime.choosing.candidates import GUARANTEES, Candidate, candidates
from specrt.runtime.choosing.choose import MARGIN, Choice, choose_method, pick

__all__ = ["GUARANTEES", "MARGIN", "Candidate", "Choice", "candidates", "choose_method", "pick"]
