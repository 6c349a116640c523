/*
 * The C API from many threads at once (tests/runtime/test_capi.py builds and runs this).
 *
 *   capi_threads BUNDLE
 *
 * THREADS threads share one pipeline and generate at the same time, each its own class, seed
 * and method; one of them passes a bad parameter. Then the main thread generates every job
 * again, alone. Exit 0 only if every threaded result equals its solo result byte for byte and
 * the bad job, alone among them, failed with SPECRT_ERR_INVALID_ARGUMENT and its own message
 * (specrt_last_error is per thread).
 */
#include <specrt.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 6
#define BAD 3 /* the job with an invalid parameter */

typedef struct {
    specrt_pipeline *pipe;
    int32_t class_id;
    uint64_t seed;
    const char *method, *params;
    uint8_t *pixels;
    size_t size;
    specrt_status status;
    char message[512];
} job;

static void *run(void *arg) {
    job *j = (job *)arg;
    j->status = specrt_generate(j->pipe, &j->class_id, 1, j->method, j->params, j->seed, j->pixels, j->size, NULL);
    snprintf(j->message, sizeof j->message, "%s", specrt_last_error());
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s BUNDLE\n", argv[0]);
        return 64;
    }
    specrt_pipeline *pipe = NULL;
    if (specrt_open(argv[1], "ort", &pipe) != SPECRT_OK) {
        fprintf(stderr, "open failed: %s\n", specrt_last_error());
        return 10;
    }
    int32_t height = 0, width = 0;
    specrt_image_size(pipe, &height, &width);
    const size_t size = (size_t)height * (size_t)width * 3;
    job jobs[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (job){pipe, i % 10, (uint64_t)(100 + i), i % 2 ? "sd" : "ar",
                        i == BAD ? "{\"draft_len\": 2.5}" : (i % 2 ? "{\"draft_len\": 2}" : "{}"),
                        malloc(size), size, SPECRT_OK, ""};
    }
    for (int i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, run, &jobs[i]);
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);

    int failures = 0;
    uint8_t *solo = malloc(size);
    for (int i = 0; i < THREADS; i++) {
        if (i == BAD) {
            if (jobs[i].status != SPECRT_ERR_INVALID_ARGUMENT || !strstr(jobs[i].message, "draft_len")) {
                fprintf(stderr, "job %d: expected INVALID_ARGUMENT about draft_len, got %d: %s\n", i,
                        (int)jobs[i].status, jobs[i].message);
                failures++;
            }
            continue;
        }
        if (jobs[i].status != SPECRT_OK || jobs[i].message[0] != '\0') {
            fprintf(stderr, "job %d failed in a thread (%d): %s\n", i, (int)jobs[i].status, jobs[i].message);
            failures++;
            continue;
        }
        specrt_status status = specrt_generate(pipe, &jobs[i].class_id, 1, jobs[i].method, jobs[i].params,
                                               jobs[i].seed, solo, size, NULL);
        if (status != SPECRT_OK || memcmp(solo, jobs[i].pixels, size) != 0) {
            fprintf(stderr, "job %d: threaded pixels differ from the solo run (status %d)\n", i, (int)status);
            failures++;
        }
    }
    for (int i = 0; i < THREADS; i++) free(jobs[i].pixels);
    free(solo);
    specrt_close(pipe);
    if (failures) return 1;
    printf("ok: %d threads on one pipeline, each result equal to its solo run\n", THREADS);
    return 0;
}
