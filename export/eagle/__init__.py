"""EAGLE-style draft heads (one decoder layer over the target's hidden states).

model.py: the head in LANTERN's key layout (models/drafters/cnets_llamagen.py) with the
graphs' pure-function entry point; checkpoint.py: loading and saving that layout;
train.py: `specrt train-draft` (the EAGLE/LANTERN recipe).
"""
