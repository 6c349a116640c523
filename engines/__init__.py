"""specrt.engines: TensorRT engines built from a bundle, cached per GPU and TensorRT version."""
