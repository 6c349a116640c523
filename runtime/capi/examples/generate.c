/*
 * Example host program for the specrt C API: generate images and write them as one PPM
 * (images stacked top to bottom).
 *
 *   specrt_generate BUNDLE OUT.ppm [--class N]... [--prompt TEXT]... [--method M] [--params JSON]
 *                   [--seed S] [--backend B] [--buffer-bytes N]
 *
 * --prompt (a text-to-image bundle) takes the place of --class.
 *
 * --buffer-bytes forces the pixel buffer size (to exercise SPECRT_ERR_BUFFER_TOO_SMALL).
 * On failure it prints "specrt error <code>: <message>" and exits with the status code.
 */
#include <specrt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IMAGES 64

static int report(specrt_status status) {
    fprintf(stderr, "specrt error %d: %s\n", (int)status, specrt_last_error());
    return (int)status;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s BUNDLE OUT.ppm [--class N]... [--prompt TEXT]... [--method M] [--params JSON] [--seed S] "
                        "[--backend B] [--buffer-bytes N]\n", argv[0]);
        return 64;
    }
    const char *bundle = argv[1], *out_path = argv[2];
    const char *method = "ar", *params = "{}", *backend = "ort";
    unsigned long long seed = 0;
    long long buffer_bytes = -1;
    int32_t class_ids[MAX_IMAGES];
    const char *prompts[MAX_IMAGES];
    size_t n = 0, n_prompts = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--class") && n < MAX_IMAGES) class_ids[n++] = (int32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt") && n_prompts < MAX_IMAGES) prompts[n_prompts++] = argv[i + 1];
        else if (!strcmp(argv[i], "--method")) method = argv[i + 1];
        else if (!strcmp(argv[i], "--params")) params = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "--buffer-bytes")) buffer_bytes = atoll(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 64; }
    }
    if (n_prompts) n = n_prompts;
    else if (n == 0) class_ids[n++] = 0;

    specrt_pipeline *pipe = NULL;
    specrt_status status = specrt_open(bundle, backend, &pipe);
    if (status != SPECRT_OK) return report(status);

    int32_t height = 0, width = 0;
    specrt_image_size(pipe, &height, &width);
    size_t size = buffer_bytes >= 0 ? (size_t)buffer_bytes : n * (size_t)height * (size_t)width * 3;
    uint8_t *pixels = malloc(size ? size : 1);
    specrt_stats stats;
    status = n_prompts ? specrt_generate_prompts(pipe, prompts, n, method, params, seed, pixels, size, &stats)
                       : specrt_generate(pipe, class_ids, n, method, params, seed, pixels, size, &stats);
    if (status != SPECRT_OK) {
        free(pixels);
        specrt_close(pipe);
        return report(status);
    }

    FILE *f = fopen(out_path, "wb");
    if (!f) { perror(out_path); free(pixels); specrt_close(pipe); return 74; }
    fprintf(f, "P6\n%d %d\n255\n", (int)width, (int)(height * (int32_t)n));
    fwrite(pixels, 1, size, f);
    fclose(f);
    printf("wrote %s: %zu image(s) %dx%d, %lld tokens in %lld target forwards "
           "(mean accepted length %.2f), %.3f s\n",
           out_path, n, (int)width, (int)height, (long long)stats.tokens, (long long)stats.target_forwards,
           stats.mean_accepted_length, stats.seconds_total);
    free(pixels);
    specrt_close(pipe);
    return 0;
}
