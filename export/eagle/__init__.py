"""EAGLE-style draft heads (one decoder layer over the target's hidden states): checkpoints and
training. The head module itself is specrt.models.eagle_head (the PyTorch backend runs it too),
its bundle graphs export/eagle_graphs.py.

checkpoint.py: loading and saving LANTERN's layout (models/drafters/cnets_llamagen.py);
train.py: `specrt train-draft` (the EAGLE/LANTERN recipe).
"""
