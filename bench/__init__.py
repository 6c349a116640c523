"""specrt.bench: speed and fidelity of every method, measured side by side in one run."""
