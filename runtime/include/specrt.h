/*
 * specrt C API: generate images with speculative decoding from a C or C++ application.
 *
 * A small, stable ABI over the Python runtime (embedded CPython): opaque handles, plain
 * C types, every call returns a status code and never lets an exception or a crash cross
 * the boundary. On failure, specrt_last_error() gives a one-line message.
 *
 * One entry point opens any bundle: specrt_open reads the manifest, which names the model
 * family (LlamaGen-style VQ generators: int64 tokens; continuous, MAR-style ones: float32
 * tokens), and opens that family's pipeline. Every call below works on every family.
 *
 * Threads: every call is safe from any thread. Calls serialise on one process-wide lock
 * (the embedded interpreter's), so two pipelines on two threads do not run concurrently;
 * run several processes for parallel generation.
 *
 * Typical use (images into a caller-owned buffer):
 *   specrt_pipeline *pipe = NULL;
 *   if (specrt_open("bundle", "ort", &pipe) != SPECRT_OK) { puts(specrt_last_error()); }
 *   int h, w; specrt_image_size(pipe, &h, &w);
 *   uint8_t *rgb = malloc((size_t)n * h * w * 3);
 *   specrt_stats stats;
 *   specrt_generate(pipe, ids, n, "cool-sd", "{\"relaxation_budget\": 2}", 0, rgb, (size_t)n * h * w * 3, &stats);
 *   specrt_close(pipe);
 *
 * Tokens (and images where there are any) in an output object the library owns:
 *   specrt_output *out = NULL;
 *   specrt_generate_output(pipe, ids, n, "cspd", NULL, 0, 1, &out);
 *   specrt_dtype dtype; int64_t shape[8]; size_t rank;
 *   specrt_output_token_dtype(out, &dtype);
 *   specrt_output_token_shape(out, shape, 8, &rank);        [n, seq_len, channels] here
 *   const float *latents; specrt_output_tokens_float32(out, &latents, NULL);
 *   const uint8_t *rgb; specrt_output_images(out, &rgb, &h, &w);   NULL when not decoded
 *   specrt_output_free(out);
 */
#ifndef SPECRT_H
#define SPECRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SPECRT_API __declspec(dllexport)
#else
#define SPECRT_API __attribute__((visibility("default")))
#endif

/* Status codes returned by every call. */
typedef enum specrt_status {
    SPECRT_OK = 0,
    SPECRT_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad JSON, unknown method or parameter, a value out of
                                        its range (specrt.validation), bad class id or prompt, a corrupt or
                                        inconsistent bundle */
    SPECRT_ERR_NOT_FOUND = 2,        /* bundle path missing or not a bundle */
    SPECRT_ERR_BUFFER_TOO_SMALL = 3, /* the caller's pixel buffer cannot hold the images */
    SPECRT_ERR_RUNTIME = 4,          /* the Python runtime could not start or is not installed */
    SPECRT_ERR_INTERNAL = 5          /* a bug: the message carries the Python exception */
} specrt_status;

typedef struct specrt_pipeline specrt_pipeline;

/* One generate call's tokens, images (when decoded) and statistics; owned by the library, read
 * through the specrt_output_* calls, released with specrt_output_free. Immutable: its accessors
 * take no lock and may be called from any thread. */
typedef struct specrt_output specrt_output;

/* The element type of a model family's tokens. */
typedef enum specrt_dtype {
    SPECRT_DTYPE_INT64 = 1,   /* VQ codebook indices (LlamaGen family) */
    SPECRT_DTYPE_FLOAT32 = 2  /* continuous latents (continuous, MAR-style family) */
} specrt_dtype;

/* Per-call statistics (summed over the images of the call). A number the bundle's family does
 * not measure is 0 (a continuous bundle: the per-part seconds; its draft forwards are its
 * drafted tokens, one draft step each). */
typedef struct specrt_stats {
    int64_t tokens;                /* image tokens generated */
    int64_t target_forwards;       /* target model forward passes */
    int64_t draft_forwards;        /* draft model forward passes */
    double mean_accepted_length;   /* tokens per target forward */
    double seconds_total;          /* wall time of the call */
    double seconds_target;         /* time in target forwards */
    double seconds_draft;          /* time in draft forwards */
    double seconds_verify;         /* verification and sampling */
    double seconds_cache;          /* KV cache maintenance */
    double seconds_decode;         /* decode to pixels */
} specrt_stats;

/* Open a pipeline on a bundle directory. backend: "ort" (default when NULL), "ort-cpu",
 * "ort-cuda", "ort-trt" (onnxruntime execution providers) or "trt" (engines built by
 * `specrt build`). The environment variable SPECRT_THREADS, when set, is the number of
 * intra-op CPU threads per model call (as the CLI's --threads; unset: onnxruntime's default,
 * one per core). On success *out holds the handle. */
SPECRT_API specrt_status specrt_open(const char *bundle_dir, const char *backend, specrt_pipeline **out);

/* Height and width in pixels of one generated image (3 channels, RGB8); 0 x 0 for a bundle
 * without a decoder (it generates tokens only: see specrt_has_decoder). */
SPECRT_API specrt_status specrt_image_size(const specrt_pipeline *pipe, int32_t *height, int32_t *width);

/* *has_decoder = 1 when the bundle decodes tokens to images, 0 when it generates tokens only
 * (a continuous bundle exported without its tokenizer's decoder). */
SPECRT_API specrt_status specrt_has_decoder(const specrt_pipeline *pipe, int32_t *has_decoder);

/* The element type of the bundle's tokens: SPECRT_DTYPE_INT64 (LlamaGen) or SPECRT_DTYPE_FLOAT32
 * (continuous). */
SPECRT_API specrt_status specrt_token_dtype(const specrt_pipeline *pipe, specrt_dtype *dtype);

/* Generate one image per class id into `pixels` (caller-owned, n * height * width * 3 bytes,
 * row-major RGB8, image after image). method: the family's, LlamaGen "ar", "sd", "cool-sd",
 * "lantern", "sjd", "sjd-pac"; continuous "ar", "cspd"; sd, cool-sd, lantern and cspd need a
 * bundle exported with a draft (without one: SPECRT_ERR_INVALID_ARGUMENT). params_json: a JSON
 * object of method and sampling parameters, or NULL / "{}". Sampling keys (LlamaGen cfg_scale,
 * temperature, top_k, top_p; continuous cfg_scale, temperature, cfg_schedule) left out, or null,
 * take the bundle's sampling_defaults (its model family's, as on every other path). The n images
 * are decoded together; image i uses seed + i and nothing else, so it is the image a call
 * with that one class id and seed + i gives (a continuous model's: up to the float rounding of
 * its batched graphs). Same seed and class ids, same images. stats may be NULL.
 * A bundle without a decoder: SPECRT_ERR_INVALID_ARGUMENT (use specrt_generate_output). */
SPECRT_API specrt_status specrt_generate(specrt_pipeline *pipe, const int32_t *class_ids, size_t n,
                                         const char *method, const char *params_json, uint64_t seed,
                                         uint8_t *pixels, size_t pixels_size, specrt_stats *stats);

/* specrt_generate for a text-to-image bundle exported with a text encoder: one image per
 * UTF-8, NUL-terminated prompt (n of them). Same buffers, parameters and seeds. */
SPECRT_API specrt_status specrt_generate_prompts(specrt_pipeline *pipe, const char *const *prompts, size_t n,
                                                 const char *method, const char *params_json, uint64_t seed,
                                                 uint8_t *pixels, size_t pixels_size, specrt_stats *stats);

/* Generate one image's tokens per class id into a new output object (*out; NULL on failure).
 * Method, parameters and seeds as specrt_generate. decode: nonzero also decodes the tokens to
 * images where the bundle has a decoder (a bundle without one gives tokens only, no error);
 * 0 gives tokens only (the decode skipped; the tokens are the same either way). */
SPECRT_API specrt_status specrt_generate_output(specrt_pipeline *pipe, const int32_t *class_ids, size_t n,
                                                const char *method, const char *params_json, uint64_t seed,
                                                int32_t decode, specrt_output **out);

/* specrt_generate_output for a text-to-image bundle: one image's tokens per UTF-8 prompt. */
SPECRT_API specrt_status specrt_generate_prompts_output(specrt_pipeline *pipe, const char *const *prompts, size_t n,
                                                        const char *method, const char *params_json, uint64_t seed,
                                                        int32_t decode, specrt_output **out);

/* The element type of the output's tokens (the bundle's, specrt_token_dtype). */
SPECRT_API specrt_status specrt_output_token_dtype(const specrt_output *out, specrt_dtype *dtype);

/* The shape of the output's tokens, row-major: LlamaGen [n, grid, grid], continuous [n, seq_len,
 * channels]; dims[0] is always the number of images. *rank gets the number of dimensions; dims
 * (room for `capacity` of them; may be NULL when capacity is 0, to ask the rank) gets them, or
 * SPECRT_ERR_BUFFER_TOO_SMALL when capacity < rank. */
SPECRT_API specrt_status specrt_output_token_shape(const specrt_output *out, int64_t *dims, size_t capacity,
                                                   size_t *rank);

/* The output's tokens, image after image (the shape's product of them): a pointer into the
 * output, valid until specrt_output_free. count, when not NULL, gets the number of tokens
 * (elements). Asking for the other dtype is SPECRT_ERR_INVALID_ARGUMENT (its message names the
 * right call). */
SPECRT_API specrt_status specrt_output_tokens_int64(const specrt_output *out, const int64_t **tokens, size_t *count);
SPECRT_API specrt_status specrt_output_tokens_float32(const specrt_output *out, const float **tokens, size_t *count);

/* The output's images, row-major RGB8, image after image (dims[0] of them, height * width * 3
 * bytes each): a pointer into the output, valid until specrt_output_free. When the output holds
 * none (decode 0, or a bundle without a decoder): SPECRT_OK with *pixels NULL and 0 x 0. height
 * and width may be NULL. */
SPECRT_API specrt_status specrt_output_images(const specrt_output *out, const uint8_t **pixels, int32_t *height,
                                              int32_t *width);

/* The statistics of the call that made the output (numbers a family does not measure are 0). */
SPECRT_API specrt_status specrt_output_stats(const specrt_output *out, specrt_stats *stats);

/* Release an output (NULL is a no-op). */
SPECRT_API void specrt_output_free(specrt_output *out);

/* The message of the last failed call on this thread ("" when none). Valid until the
 * thread's next specrt call. */
SPECRT_API const char *specrt_last_error(void);

/* Release a pipeline (NULL is a no-op). */
SPECRT_API void specrt_close(specrt_pipeline *pipe);

#ifdef __cplusplus
}
#endif

#endif /* SPECRT_H */
