/*
 * specrt C API: generate images with speculative decoding from a C or C++ application.
 *
 * A small, stable ABI over the Python runtime (embedded CPython): opaque handles, plain
 * C types, every call returns a status code and never lets an exception or a crash cross
 * the boundary. On failure, specrt_last_error() gives a one-line message.
 *
 * Threads: every call is safe from any thread. Calls serialise on one process-wide lock
 * (the embedded interpreter's), so two pipelines on two threads do not run concurrently;
 * run several processes for parallel generation.
 *
 * Typical use:
 *   specrt_pipeline *pipe = NULL;
 *   if (specrt_open("bundle", "ort", &pipe) != SPECRT_OK) { puts(specrt_last_error()); }
 *   int h, w; specrt_image_size(pipe, &h, &w);
 *   uint8_t *rgb = malloc((size_t)n * h * w * 3);
 *   specrt_stats stats;
 *   specrt_generate(pipe, ids, n, "cool-sd", "{\"relaxation_budget\": 2}", 0, rgb, (size_t)n * h * w * 3, &stats);
 *   specrt_close(pipe);
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

/* Per-call statistics (summed over the images of the call). */
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
    double seconds_decode;         /* VQ decode to pixels */
} specrt_stats;

/* Open a pipeline on a bundle directory. backend: "ort" (default when NULL), "ort-cpu",
 * "ort-cuda", "ort-trt" (onnxruntime execution providers) or "trt" (engines built by
 * `specrt build`). The environment variable SPECRT_THREADS, when set, is the number of
 * intra-op CPU threads per model call (as the CLI's --threads; unset: onnxruntime's default,
 * one per core). On success *out holds the handle. */
SPECRT_API specrt_status specrt_open(const char *bundle_dir, const char *backend, specrt_pipeline **out);

/* Height and width in pixels of one generated image (3 channels, RGB8). */
SPECRT_API specrt_status specrt_image_size(const specrt_pipeline *pipe, int32_t *height, int32_t *width);

/* Generate one image per class id into `pixels` (caller-owned, n * height * width * 3 bytes,
 * row-major RGB8, image after image). method: "ar", "sd", "cool-sd", "lantern", "sjd",
 * "sjd-pac"; sd, cool-sd and lantern need a bundle exported with a draft (without one:
 * SPECRT_ERR_INVALID_ARGUMENT). params_json: a JSON object of method and sampling parameters,
 * or NULL / "{}". Sampling keys (cfg_scale, temperature, top_k, top_p) left out, or null, take
 * the bundle's sampling_defaults (its model family's, as on every other path). The n images
 * are decoded together; image i uses seed + i and nothing else, so it is the image a call
 * with that one class id and seed + i gives. Same seed, same images. stats may be NULL. */
SPECRT_API specrt_status specrt_generate(specrt_pipeline *pipe, const int32_t *class_ids, size_t n,
                                         const char *method, const char *params_json, uint64_t seed,
                                         uint8_t *pixels, size_t pixels_size, specrt_stats *stats);

/* specrt_generate for a text-to-image bundle exported with a text encoder: one image per
 * UTF-8, NUL-terminated prompt (n of them). Same buffers, parameters and seeds. */
SPECRT_API specrt_status specrt_generate_prompts(specrt_pipeline *pipe, const char *const *prompts, size_t n,
                                                 const char *method, const char *params_json, uint64_t seed,
                                                 uint8_t *pixels, size_t pixels_size, specrt_stats *stats);

/* The message of the last failed call on this thread ("" when none). Valid until the
 * thread's next specrt call. */
SPECRT_API const char *specrt_last_error(void);

/* Release a pipeline (NULL is a no-op). */
SPECRT_API void specrt_close(specrt_pipeline *pipe);

#ifdef __cplusplus
}
#endif

#endif /* SPECRT_H */
