/*
 * The C API's output object and family queries (tests/runtime/test_capi.py builds and runs this).
 *
 *   capi_output BUNDLE int64|float32 HAS_DECODER(0|1)
 *
 * Opens the bundle, checks what the pipeline says of its tokens and decoder, generates one image's
 * output with and without decode, and checks every accessor: the dtype and shape, the token
 * accessor of the bundle's dtype (and the other one refused with a message naming the right
 * call), the images (NULL when not decoded or no decoder), the statistics, the NULL-argument
 * errors, and that an output outlives its pipeline. Prints "ok" and exits 0, or names the first
 * failed check and exits 1.
 */
#include <specrt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "check failed (line %d): %s [%s]\n", __LINE__, #cond, specrt_last_error()); \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s BUNDLE int64|float32 HAS_DECODER\n", argv[0]);
        return 64;
    }
    const specrt_dtype want = strcmp(argv[2], "float32") ? SPECRT_DTYPE_INT64 : SPECRT_DTYPE_FLOAT32;
    const int32_t want_decoder = atoi(argv[3]);
    specrt_pipeline *pipe = NULL;
    CHECK(specrt_open(argv[1], NULL, &pipe) == SPECRT_OK);

    specrt_dtype dtype;
    int32_t has_decoder = -1, height = -1, width = -1;
    CHECK(specrt_token_dtype(pipe, &dtype) == SPECRT_OK && dtype == want);
    CHECK(specrt_has_decoder(pipe, &has_decoder) == SPECRT_OK && has_decoder == want_decoder);
    CHECK(specrt_image_size(pipe, &height, &width) == SPECRT_OK);
    CHECK(want_decoder ? (height > 0 && width > 0) : (height == 0 && width == 0));
    CHECK(specrt_token_dtype(NULL, &dtype) == SPECRT_ERR_INVALID_ARGUMENT);
    CHECK(specrt_has_decoder(pipe, NULL) == SPECRT_ERR_INVALID_ARGUMENT);

    const int32_t ids[] = {1};
    specrt_output *decoded = NULL, *tokens_only = NULL, *bad = (specrt_output *)1;
    CHECK(specrt_generate_output(pipe, ids, 1, "ar", NULL, 4, 1, NULL) == SPECRT_ERR_INVALID_ARGUMENT);
    CHECK(specrt_generate_output(pipe, ids, 1, "no-such-method", NULL, 4, 1, &bad) == SPECRT_ERR_INVALID_ARGUMENT);
    CHECK(bad == NULL && strstr(specrt_last_error(), "no-such-method"));
    CHECK(specrt_generate_output(pipe, ids, 0, "ar", NULL, 4, 1, &bad) == SPECRT_ERR_INVALID_ARGUMENT && bad == NULL);
    CHECK(specrt_generate_output(pipe, ids, 1, "ar", "{}", 4, 1, &decoded) == SPECRT_OK && decoded != NULL);
    CHECK(specrt_generate_output(pipe, ids, 1, "ar", "{}", 4, 0, &tokens_only) == SPECRT_OK);
    specrt_close(pipe); /* outputs are the caller's until freed: they outlive the pipeline */

    /* dtype and shape */
    int64_t dims[8];
    size_t rank = 0;
    CHECK(specrt_output_token_dtype(decoded, &dtype) == SPECRT_OK && dtype == want);
    CHECK(specrt_output_token_shape(decoded, NULL, 0, &rank) == SPECRT_ERR_BUFFER_TOO_SMALL && rank == 3);
    CHECK(specrt_output_token_shape(decoded, dims, 2, &rank) == SPECRT_ERR_BUFFER_TOO_SMALL && rank == 3);
    CHECK(specrt_output_token_shape(decoded, dims, 8, &rank) == SPECRT_OK && rank == 3 && dims[0] == 1);
    CHECK(specrt_output_token_shape(decoded, dims, 8, NULL) == SPECRT_ERR_INVALID_ARGUMENT);
    const size_t elements = (size_t)(dims[0] * dims[1] * dims[2]);

    /* the accessor of the bundle's dtype, and the other one refused */
    size_t count = 0, count_again = 0;
    const void *data = NULL, *data_again = NULL;
    if (want == SPECRT_DTYPE_FLOAT32) {
        const int64_t *wrong = (const int64_t *)1;
        CHECK(specrt_output_tokens_int64(decoded, &wrong, &count) == SPECRT_ERR_INVALID_ARGUMENT && wrong == NULL);
        CHECK(strstr(specrt_last_error(), "specrt_output_tokens_float32") != NULL);
        CHECK(specrt_output_tokens_float32(decoded, (const float **)&data, &count) == SPECRT_OK);
        CHECK(specrt_output_tokens_float32(tokens_only, (const float **)&data_again, &count_again) == SPECRT_OK);
        CHECK(memcmp(data, data_again, count * sizeof(float)) == 0);
    } else {
        const float *wrong = (const float *)1;
        CHECK(specrt_output_tokens_float32(decoded, &wrong, &count) == SPECRT_ERR_INVALID_ARGUMENT && wrong == NULL);
        CHECK(strstr(specrt_last_error(), "specrt_output_tokens_int64") != NULL);
        CHECK(specrt_output_tokens_int64(decoded, (const int64_t **)&data, &count) == SPECRT_OK);
        CHECK(specrt_output_tokens_int64(tokens_only, (const int64_t **)&data_again, &count_again) == SPECRT_OK);
        CHECK(memcmp(data, data_again, count * sizeof(int64_t)) == 0);
    }
    CHECK(data != NULL && count == elements && count_again == elements);
    CHECK(specrt_output_tokens_int64(decoded, NULL, NULL) == SPECRT_ERR_INVALID_ARGUMENT);

    /* images: where decoded and the bundle has a decoder */
    const uint8_t *pixels = (const uint8_t *)1;
    int32_t h = -1, w = -1;
    CHECK(specrt_output_images(decoded, &pixels, &h, &w) == SPECRT_OK);
    CHECK(want_decoder ? (pixels != NULL && h == height && w == width) : (pixels == NULL && h == 0 && w == 0));
    CHECK(specrt_output_images(tokens_only, &pixels, NULL, NULL) == SPECRT_OK && pixels == NULL);

    /* statistics */
    specrt_stats stats;
    CHECK(specrt_output_stats(decoded, &stats) == SPECRT_OK && stats.tokens > 0 && stats.target_forwards > 0);
    CHECK(stats.seconds_total > 0 && stats.mean_accepted_length > 0);
    CHECK(specrt_output_stats(NULL, &stats) == SPECRT_ERR_INVALID_ARGUMENT);

    specrt_output_free(decoded);
    specrt_output_free(tokens_only);
    specrt_output_free(NULL);
    printf("ok: %s tokens [%lld, %lld, %lld], decoder %d\n", argv[2], (long long)dims[0], (long long)dims[1],
           (long long)dims[2], (int)want_decoder);
    return 0;
}
