"""The unified-vocabulary demo: a Chameleon-architecture (Lumina-mGPT-style) generator of captioned digits.

    from specrt.export.demo.unified import store
    target = store.load_model(store.target_dir())      # transformers' ChameleonForConditionalGeneration
    tokenizer = store.load_tokenizer()                 # tokenizers.Tokenizer (tokenizer.json)

    from specrt.export.demo.unified.sampling import generate
    codes = generate(target, tokenizer, ["a thin two"], cfg_scale=3.0)   # [1, 8, 8] VQ codes
    images = store.load_vq().decode_codes(torch.from_numpy(codes))      # the t2i demo's VQ

Text and image tokens share one vocabulary (vocabulary.py: Chameleon's image-token names, Lumina-
mGPT's structural tokens, a row-end token after every row); the checkpoints in weights/target and
weights/draft are ordinary Hugging Face directories, the same input `specrt export --target DIR`
takes for a real Lumina-mGPT checkpoint. Training: training.py. Everything heavy is imported on
first use; this package itself imports nothing.
"""
