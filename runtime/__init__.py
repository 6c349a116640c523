"""specrt.runtime: the speculative decoding loop (AR, SD, Cool-SD, LANTERN, SJD, SJD-PAC)
over preallocated KV buffers, on onnxruntime, TensorRT or PyTorch. Imports with numpy alone."""
