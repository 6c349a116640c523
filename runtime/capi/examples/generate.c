/*
 * Example host program for the specrt C API: generate from any bundle (the manifest names its
 * family) and write the images as one PPM (stacked top to bottom), or the tokens as .npy.
 *
 *   specrt_generate BUNDLE OUT [--class N]... [--prompt TEXT]... [--method M] [--params JSON]
 *                   [--seed S] [--backend B] [--tokens-only] [--save-tokens FILE.npy]
 *                   [--buffer-bytes N]
 *
 * OUT gets the images (PPM) where the bundle has a decoder; with --tokens-only, or from a bundle
 * without one (a continuous bundle exported without its decoder), it gets the tokens as .npy:
 * int64 [n, grid, grid] from a LlamaGen bundle, float32 [n, seq_len, channels] from a continuous
 * one (numpy.load reads it). --save-tokens FILE writes the tokens as well as the images.
 * --prompt (a text-to-image bundle) takes the place of --class.
 *
 * The images come from specrt_generate_output (an output object the library owns); with
 * --buffer-bytes N they come from specrt_generate instead, into a caller-owned buffer of N bytes
 * (N too small exercises SPECRT_ERR_BUFFER_TOO_SMALL).
 * On failure it prints "specrt error <code>: <message>" and exits with the status code.
 */
#include <specrt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IMAGES 64
#define MAX_RANK 8

static int report(specrt_status status) {
    fprintf(stderr, "specrt error %d: %s\n", (int)status, specrt_last_error());
    return (int)status;
}

static int write_ppm(const char *path, const uint8_t *pixels, size_t n, int32_t height, int32_t width) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); return 74; }
    fprintf(f, "P6\n%d %d\n255\n", (int)width, (int)(height * (int32_t)n));
    fwrite(pixels, 1, n * (size_t)height * (size_t)width * 3, f);
    fclose(f);
    return 0;
}

/* The tokens as a .npy file (format 1.0: magic, header length, a Python-dict header padded with
 * spaces to a multiple of 64 bytes, then the data in C order). */
static int write_npy(const char *path, specrt_output *out) {
    specrt_dtype dtype;
    int64_t shape[MAX_RANK];
    size_t rank = 0, count = 0;
    const void *data = NULL;
    specrt_status status = specrt_output_token_dtype(out, &dtype);
    if (status == SPECRT_OK) status = specrt_output_token_shape(out, shape, MAX_RANK, &rank);
    if (status == SPECRT_OK) {
        if (dtype == SPECRT_DTYPE_FLOAT32) status = specrt_output_tokens_float32(out, (const float **)&data, &count);
        else status = specrt_output_tokens_int64(out, (const int64_t **)&data, &count);
    }
    if (status != SPECRT_OK) return report(status);

    const uint16_t probe = 1;
    const char order = *(const uint8_t *)&probe ? '<' : '>';
    char header[256];
    int len = snprintf(header, sizeof header, "{'descr': '%c%s', 'fortran_order': False, 'shape': (", order,
                       dtype == SPECRT_DTYPE_FLOAT32 ? "f4" : "i8");
    for (size_t i = 0; i < rank; ++i) len += snprintf(header + len, sizeof header - len, "%lld, ", (long long)shape[i]);
    len += snprintf(header + len, sizeof header - len, "), }");
    int total = 10 + len + 1; /* magic (6) + version (2) + header length (2) + header + '\n' */
    int pad = (64 - total % 64) % 64;
    uint16_t header_len = (uint16_t)(len + pad + 1);
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); return 74; }
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    const uint8_t le[2] = {(uint8_t)(header_len & 0xff), (uint8_t)(header_len >> 8)};
    fwrite(le, 1, 2, f);
    fwrite(header, 1, (size_t)len, f);
    for (int i = 0; i < pad; ++i) fputc(' ', f);
    fputc('\n', f);
    fwrite(data, dtype == SPECRT_DTYPE_FLOAT32 ? sizeof(float) : sizeof(int64_t), count, f);
    fclose(f);
    return 0;
}

static void print_stats(const specrt_stats *stats) {
    printf("%lld tokens in %lld target forwards (mean accepted length %.2f), %.3f s\n", (long long)stats->tokens,
           (long long)stats->target_forwards, stats->mean_accepted_length, stats->seconds_total);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s BUNDLE OUT [--class N]... [--prompt TEXT]... [--method M] [--params JSON] [--seed S] "
                        "[--backend B] [--tokens-only] [--save-tokens FILE.npy] [--buffer-bytes N]\n", argv[0]);
        return 64;
    }
    const char *bundle = argv[1], *out_path = argv[2];
    const char *method = "ar", *params = "{}", *backend = "ort", *tokens_path = NULL;
    unsigned long long seed = 0;
    long long buffer_bytes = -1;
    int tokens_only = 0;
    int32_t class_ids[MAX_IMAGES];
    const char *prompts[MAX_IMAGES];
    size_t n = 0, n_prompts = 0;
    for (int i = 3; i < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens-only")) { tokens_only = 1; i -= 1; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "option %s needs a value\n", argv[i]); return 64; }
        if (!strcmp(argv[i], "--class") && n < MAX_IMAGES) class_ids[n++] = (int32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt") && n_prompts < MAX_IMAGES) prompts[n_prompts++] = argv[i + 1];
        else if (!strcmp(argv[i], "--method")) method = argv[i + 1];
        else if (!strcmp(argv[i], "--params")) params = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "--save-tokens")) tokens_path = argv[i + 1];
        else if (!strcmp(argv[i], "--buffer-bytes")) buffer_bytes = atoll(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 64; }
    }
    if (n_prompts) n = n_prompts;
    else if (n == 0) class_ids[n++] = 0;

    specrt_pipeline *pipe = NULL;
    specrt_status status = specrt_open(bundle, backend, &pipe);
    if (status != SPECRT_OK) return report(status);

    if (buffer_bytes >= 0) { /* images into a caller-owned buffer (specrt_generate) */
        int32_t height = 0, width = 0;
        specrt_image_size(pipe, &height, &width);
        uint8_t *pixels = malloc(buffer_bytes ? (size_t)buffer_bytes : 1);
        specrt_stats stats;
        status = n_prompts ? specrt_generate_prompts(pipe, prompts, n, method, params, seed, pixels, (size_t)buffer_bytes, &stats)
                           : specrt_generate(pipe, class_ids, n, method, params, seed, pixels, (size_t)buffer_bytes, &stats);
        int code = status != SPECRT_OK ? report(status) : write_ppm(out_path, pixels, n, height, width);
        if (!code) {
            printf("wrote %s: %zu image(s) %dx%d, ", out_path, n, (int)width, (int)height);
            print_stats(&stats);
        }
        free(pixels);
        specrt_close(pipe);
        return code;
    }

    /* tokens, and images where the bundle has a decoder (specrt_generate_output) */
    specrt_output *out = NULL;
    status = n_prompts ? specrt_generate_prompts_output(pipe, prompts, n, method, params, seed, !tokens_only, &out)
                       : specrt_generate_output(pipe, class_ids, n, method, params, seed, !tokens_only, &out);
    specrt_close(pipe);
    if (status != SPECRT_OK) return report(status);

    const uint8_t *pixels = NULL;
    int32_t height = 0, width = 0;
    specrt_stats stats;
    specrt_output_images(out, &pixels, &height, &width);
    specrt_output_stats(out, &stats);
    int code = 0;
    if (pixels) {
        code = write_ppm(out_path, pixels, n, height, width);
        if (!code) printf("wrote %s: %zu image(s) %dx%d, ", out_path, n, (int)width, (int)height);
    } else {
        code = write_npy(out_path, out);
        if (!code) {
            specrt_dtype dtype;
            int64_t shape[MAX_RANK];
            size_t rank = 0;
            specrt_output_token_dtype(out, &dtype);
            specrt_output_token_shape(out, shape, MAX_RANK, &rank);
            printf("wrote %s: %s tokens [", out_path, dtype == SPECRT_DTYPE_FLOAT32 ? "float32" : "int64");
            for (size_t i = 0; i < rank; ++i) printf(i ? ", %lld" : "%lld", (long long)shape[i]);
            printf("]%s, ", tokens_only ? "" : " (the bundle has no decoder)");
        }
    }
    if (!code) print_stats(&stats);
    if (!code && tokens_path) {
        code = write_npy(tokens_path, out);
        if (!code) printf("wrote %s: the tokens\n", tokens_path);
    }
    specrt_output_free(out);
    return code;
}
