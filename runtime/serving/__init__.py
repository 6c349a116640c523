"""Serving specrt behind Triton Inference Server.

One wire format (`protocol`), one request handler that turns a batch of requests into
generate calls of any model family's pipeline (`handler`, asking runtime/families what the
model is conditioned on, decodes and returns), and two ways to host it: PyTriton in this process
(`pytriton_server`, `specrt serve`) and a model repository for the stock tritonserver
container (`repository` writes it, `python_backend` is its model). `client` speaks the
format from Python through tritonclient. Only `pytriton_server` and `client` need the
`serve` extra; the rest imports with numpy alone.
"""
