// specrt C API implementation: embeds CPython and calls specrt.runtime.embedding.
//
// Why embed rather than reimplement: the decoding methods live once, in the Python runtime,
// shared by every backend; the C ABI is a thin, exception-free shell around them.
// Every entry point catches everything, so no C++ or Python exception crosses the boundary.
#include "specrt.h"

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace py = pybind11;

#ifndef SPECRT_DEFAULT_PYTHON
#define SPECRT_DEFAULT_PYTHON ""
#endif

struct specrt_pipeline {
    py::object handle;  // a specrt.runtime.embedding.Handle (the family's pipeline); touched only with the GIL held
    int32_t height = 0;  // 0 x 0: no decoder
    int32_t width = 0;
    bool has_decoder = false;
    specrt_dtype dtype = SPECRT_DTYPE_INT64;
};

// Plain C++ copies of one call's results: no Python object, so its accessors need neither the
// GIL nor the call lock.
struct specrt_output {
    specrt_dtype dtype = SPECRT_DTYPE_INT64;
    std::vector<int64_t> shape;
    std::vector<int64_t> ints;  // dtype int64
    std::vector<float> floats;  // dtype float32
    std::vector<uint8_t> pixels;
    bool has_images = false;
    int32_t height = 0;
    int32_t width = 0;
    specrt_stats stats{};
};

namespace {

thread_local std::string last_error;
std::mutex call_lock;          // one call at a time, process-wide (documented in specrt.h)
std::once_flag interpreter_once;
std::string interpreter_error;  // set once if the interpreter could not start

specrt_status fail(specrt_status code, const std::string &message) {
    last_error = message;
    return code;
}

// Start CPython once. The interpreter is pointed at the Python that specrt was built
// against (or $SPECRT_PYTHON), so a virtual environment's site-packages are found through
// its pyvenv.cfg. Signal handlers stay with the host application.
void start_interpreter() {
    if (Py_IsInitialized()) {
        return;  // the host already embeds Python; share it
    }
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;
    const char *python = std::getenv("SPECRT_PYTHON");
    std::string executable = (python && *python) ? python : SPECRT_DEFAULT_PYTHON;
    if (!executable.empty()) {
        PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, executable.c_str());
        if (PyStatus_Exception(status)) {
            PyConfig_Clear(&config);
            interpreter_error = "could not configure the embedded Python interpreter";
            return;
        }
    }
    try {
        py::initialize_interpreter(&config, 0, nullptr, false);
    } catch (const std::exception &exc) {
        interpreter_error = std::string("could not start the embedded Python interpreter: ") + exc.what();
        return;
    }
    PyEval_SaveThread();  // release the GIL; every call re-acquires it
}

bool interpreter_ready() {
    std::call_once(interpreter_once, start_interpreter);
    if (!interpreter_error.empty()) {
        last_error = interpreter_error;
        return false;
    }
    return true;
}

// Translate the Python exception in flight into a status code via embedding.status_of.
specrt_status fail_from_python(py::error_already_set &err) {
    try {
        py::module_ embedding = py::module_::import("specrt.runtime.embedding");
        py::tuple status = embedding.attr("status_of")(err.value());
        return fail(static_cast<specrt_status>(status[0].cast<int>()), status[1].cast<std::string>());
    } catch (...) {
        // specrt itself is not importable: report the first line of the original error
        std::string what = err.what();
        return fail(SPECRT_ERR_RUNTIME, "specrt Python runtime unavailable: " + what.substr(0, what.find('\n')));
    }
}

py::module_ embedding_module() { return py::module_::import("specrt.runtime.embedding"); }

void read_stats(const py::dict &s, specrt_stats *stats) {
    stats->tokens = static_cast<int64_t>(s["tokens"].cast<double>());
    stats->target_forwards = static_cast<int64_t>(s["target_forwards"].cast<double>());
    stats->draft_forwards = static_cast<int64_t>(s["draft_forwards"].cast<double>());
    stats->mean_accepted_length = s["mean_accepted_length"].cast<double>();
    stats->seconds_total = s["seconds_total"].cast<double>();
    stats->seconds_target = s["seconds_target"].cast<double>();
    stats->seconds_draft = s["seconds_draft"].cast<double>();
    stats->seconds_verify = s["seconds_verify"].cast<double>();
    stats->seconds_cache = s["seconds_cache"].cast<double>();
    stats->seconds_decode = s["seconds_decode"].cast<double>();
}

// The shared body of specrt_generate and specrt_generate_prompts: check the buffers, call
// `function` of specrt.runtime.embedding with (pipe, conditions, method, params, seed), copy
// the pixels and statistics back.
template <typename Conditions>
specrt_status generate_with(const char *name, const char *function, specrt_pipeline *pipe, const Conditions &conditions,
                            size_t n, const char *method, const char *params_json, uint64_t seed, uint8_t *pixels,
                            size_t pixels_size, specrt_stats *stats) {
    if (n == 0) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, std::string(name) + ": n must be at least 1");
    }
    if (!pipe->has_decoder) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, std::string(name) + ": this bundle has no decoder, it generates "
                                                 "tokens only (call specrt_generate_output and read its tokens)");
    }
    const size_t image_bytes = static_cast<size_t>(pipe->height) * static_cast<size_t>(pipe->width) * 3;
    if (image_bytes == 0 || n > SIZE_MAX / image_bytes) {  // n * image_bytes would wrap around
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_generate: n = " + std::to_string(n) + " images cannot fit in memory");
    }
    const size_t needed = n * image_bytes;
    if (pixels_size < needed) {
        return fail(SPECRT_ERR_BUFFER_TOO_SMALL, std::string(name) + ": pixel buffer holds " + std::to_string(pixels_size) +
                                                     " bytes, " + std::to_string(needed) + " needed");
    }
    std::lock_guard<std::mutex> guard(call_lock);
    py::gil_scoped_acquire gil;
    try {
        py::object params = params_json ? py::object(py::str(params_json)) : py::object(py::none());
        py::tuple result = embedding_module().attr(function)(pipe->handle, conditions(), method, params, seed);
        std::string bytes = result[0].cast<std::string>();
        if (bytes.size() != needed) {
            return fail(SPECRT_ERR_INTERNAL, std::string(name) + ": runtime returned " + std::to_string(bytes.size()) +
                                                 " bytes, expected " + std::to_string(needed));
        }
        std::memcpy(pixels, bytes.data(), needed);
        if (stats != nullptr) {
            read_stats(result[1].cast<py::dict>(), stats);
        }
        return SPECRT_OK;
    } catch (py::error_already_set &err) {
        return fail_from_python(err);
    } catch (const std::exception &exc) {
        return fail(SPECRT_ERR_INTERNAL, exc.what());
    }
}

// The shared body of specrt_generate_output and specrt_generate_prompts_output: call `function`
// of specrt.runtime.embedding with (handle, conditions, method, params, seed, decode) and copy
// what it returns (dtype, shape, token bytes, pixel bytes or None, height, width, stats) into a
// new specrt_output.
template <typename Conditions>
specrt_status generate_output_with(const char *name, const char *function, specrt_pipeline *pipe,
                                   const Conditions &conditions, size_t n, const char *method, const char *params_json,
                                   uint64_t seed, int32_t decode, specrt_output **out) {
    if (n == 0) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, std::string(name) + ": n must be at least 1");
    }
    std::lock_guard<std::mutex> guard(call_lock);
    py::gil_scoped_acquire gil;
    try {
        py::object params = params_json ? py::object(py::str(params_json)) : py::object(py::none());
        py::tuple result =
            embedding_module().attr(function)(pipe->handle, conditions(), method, params, seed, decode != 0);
        auto output = std::make_unique<specrt_output>();
        output->dtype = static_cast<specrt_dtype>(result[0].cast<int>());
        output->shape = result[1].cast<std::vector<int64_t>>();
        size_t count = 1;
        for (int64_t d : output->shape) {
            count *= static_cast<size_t>(d);
        }
        std::string tokens = result[2].cast<std::string>();
        const size_t element = output->dtype == SPECRT_DTYPE_FLOAT32 ? sizeof(float) : sizeof(int64_t);
        if (output->shape.empty() || static_cast<size_t>(output->shape[0]) != n || tokens.size() != count * element) {
            return fail(SPECRT_ERR_INTERNAL, std::string(name) + ": runtime returned " + std::to_string(tokens.size()) +
                                                 " token bytes for " + std::to_string(n) + " images, shape of " +
                                                 std::to_string(count) + " elements");
        }
        if (output->dtype == SPECRT_DTYPE_FLOAT32) {
            output->floats.resize(count);
            std::memcpy(output->floats.data(), tokens.data(), tokens.size());
        } else {
            output->ints.resize(count);
            std::memcpy(output->ints.data(), tokens.data(), tokens.size());
        }
        if (!result[3].is_none()) {
            std::string pixels = result[3].cast<std::string>();
            output->height = result[4].cast<int32_t>();
            output->width = result[5].cast<int32_t>();
            if (pixels.size() != n * static_cast<size_t>(output->height) * static_cast<size_t>(output->width) * 3) {
                return fail(SPECRT_ERR_INTERNAL, std::string(name) + ": runtime returned " +
                                                     std::to_string(pixels.size()) + " pixel bytes for " +
                                                     std::to_string(n) + " images");
            }
            output->pixels.assign(pixels.begin(), pixels.end());
            output->has_images = true;
        }
        read_stats(result[6].cast<py::dict>(), &output->stats);
        *out = output.release();
        return SPECRT_OK;
    } catch (py::error_already_set &err) {
        return fail_from_python(err);
    } catch (const std::exception &exc) {
        return fail(SPECRT_ERR_INTERNAL, exc.what());
    }
}

// specrt_generate_prompts' UTF-8 prompts as a Python list of bytes (built with the GIL held);
// they are decoded on the Python side (a clear error if they are not UTF-8).
py::list prompt_list(const char *const *prompts, size_t n) {
    py::list out;
    for (size_t i = 0; i < n; ++i) {
        out.append(py::bytes(prompts[i]));
    }
    return out;
}

// NULL checks shared by the prompt calls: the message names the first NULL prompt.
bool prompts_given(const char *name, const char *const *prompts, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (prompts[i] == nullptr) {
            fail(SPECRT_ERR_INVALID_ARGUMENT, std::string(name) + ": prompt " + std::to_string(i) + " is NULL");
            return false;
        }
    }
    return true;
}

}  // namespace

extern "C" {

specrt_status specrt_open(const char *bundle_dir, const char *backend, specrt_pipeline **out) {
    last_error.clear();
    if (bundle_dir == nullptr || out == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_open: bundle_dir and out must not be NULL");
    }
    *out = nullptr;
    std::lock_guard<std::mutex> guard(call_lock);
    if (!interpreter_ready()) {
        return SPECRT_ERR_RUNTIME;
    }
    py::gil_scoped_acquire gil;
    try {
        py::module_ embedding = embedding_module();
        py::object backend_arg = backend ? py::object(py::str(backend)) : py::object(py::none());
        py::object opened = embedding.attr("open_handle")(bundle_dir, backend_arg);
        py::tuple info = opened.attr("info");  // (family, dtype, has_decoder, height, width)
        auto handle = std::make_unique<specrt_pipeline>();
        handle->dtype = static_cast<specrt_dtype>(info[1].cast<int>());
        handle->has_decoder = info[2].cast<bool>();
        handle->height = info[3].cast<int32_t>();
        handle->width = info[4].cast<int32_t>();
        handle->handle = std::move(opened);
        *out = handle.release();
        return SPECRT_OK;
    } catch (py::error_already_set &err) {
        return fail_from_python(err);
    } catch (const std::exception &exc) {
        return fail(SPECRT_ERR_INTERNAL, exc.what());
    }
}

specrt_status specrt_image_size(const specrt_pipeline *pipe, int32_t *height, int32_t *width) {
    last_error.clear();
    if (pipe == nullptr || height == nullptr || width == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_image_size: arguments must not be NULL");
    }
    *height = pipe->height;
    *width = pipe->width;
    return SPECRT_OK;
}

specrt_status specrt_has_decoder(const specrt_pipeline *pipe, int32_t *has_decoder) {
    last_error.clear();
    if (pipe == nullptr || has_decoder == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_has_decoder: arguments must not be NULL");
    }
    *has_decoder = pipe->has_decoder ? 1 : 0;
    return SPECRT_OK;
}

specrt_status specrt_token_dtype(const specrt_pipeline *pipe, specrt_dtype *dtype) {
    last_error.clear();
    if (pipe == nullptr || dtype == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_token_dtype: arguments must not be NULL");
    }
    *dtype = pipe->dtype;
    return SPECRT_OK;
}

specrt_status specrt_generate(specrt_pipeline *pipe, const int32_t *class_ids, size_t n, const char *method,
                              const char *params_json, uint64_t seed, uint8_t *pixels, size_t pixels_size,
                              specrt_stats *stats) {
    last_error.clear();
    if (pipe == nullptr || class_ids == nullptr || method == nullptr || pixels == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT,
                    "specrt_generate: pipe, class_ids, method and pixels must not be NULL");
    }
    auto ids = [&] { return std::vector<int32_t>(class_ids, class_ids + n); };  // built with the GIL held
    return generate_with("specrt_generate", "generate_rgb8", pipe, ids, n, method, params_json, seed, pixels,
                         pixels_size, stats);
}

specrt_status specrt_generate_prompts(specrt_pipeline *pipe, const char *const *prompts, size_t n, const char *method,
                                      const char *params_json, uint64_t seed, uint8_t *pixels, size_t pixels_size,
                                      specrt_stats *stats) {
    last_error.clear();
    if (pipe == nullptr || prompts == nullptr || method == nullptr || pixels == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT,
                    "specrt_generate_prompts: pipe, prompts, method and pixels must not be NULL");
    }
    if (!prompts_given("specrt_generate_prompts", prompts, n)) {
        return SPECRT_ERR_INVALID_ARGUMENT;
    }
    auto texts = [&] { return prompt_list(prompts, n); };
    return generate_with("specrt_generate_prompts", "generate_rgb8_prompts", pipe, texts, n, method, params_json, seed,
                         pixels, pixels_size, stats);
}

specrt_status specrt_generate_output(specrt_pipeline *pipe, const int32_t *class_ids, size_t n, const char *method,
                                     const char *params_json, uint64_t seed, int32_t decode, specrt_output **out) {
    last_error.clear();
    if (out != nullptr) {
        *out = nullptr;
    }
    if (pipe == nullptr || class_ids == nullptr || method == nullptr || out == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT,
                    "specrt_generate_output: pipe, class_ids, method and out must not be NULL");
    }
    auto ids = [&] { return std::vector<int32_t>(class_ids, class_ids + n); };
    return generate_output_with("specrt_generate_output", "generate_output", pipe, ids, n, method, params_json, seed,
                                decode, out);
}

specrt_status specrt_generate_prompts_output(specrt_pipeline *pipe, const char *const *prompts, size_t n,
                                             const char *method, const char *params_json, uint64_t seed,
                                             int32_t decode, specrt_output **out) {
    last_error.clear();
    if (out != nullptr) {
        *out = nullptr;
    }
    if (pipe == nullptr || prompts == nullptr || method == nullptr || out == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT,
                    "specrt_generate_prompts_output: pipe, prompts, method and out must not be NULL");
    }
    if (!prompts_given("specrt_generate_prompts_output", prompts, n)) {
        return SPECRT_ERR_INVALID_ARGUMENT;
    }
    auto texts = [&] { return prompt_list(prompts, n); };
    return generate_output_with("specrt_generate_prompts_output", "generate_output_prompts", pipe, texts, n, method,
                                params_json, seed, decode, out);
}

specrt_status specrt_output_token_dtype(const specrt_output *out, specrt_dtype *dtype) {
    last_error.clear();
    if (out == nullptr || dtype == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_output_token_dtype: arguments must not be NULL");
    }
    *dtype = out->dtype;
    return SPECRT_OK;
}

specrt_status specrt_output_token_shape(const specrt_output *out, int64_t *dims, size_t capacity, size_t *rank) {
    last_error.clear();
    if (out == nullptr || rank == nullptr || (dims == nullptr && capacity > 0)) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT,
                    "specrt_output_token_shape: out and rank must not be NULL, nor dims when capacity > 0");
    }
    *rank = out->shape.size();
    if (capacity < out->shape.size()) {
        return fail(SPECRT_ERR_BUFFER_TOO_SMALL, "specrt_output_token_shape: dims holds " + std::to_string(capacity) +
                                                     " dimensions, " + std::to_string(out->shape.size()) + " needed");
    }
    std::copy(out->shape.begin(), out->shape.end(), dims);
    return SPECRT_OK;
}

specrt_status specrt_output_tokens_int64(const specrt_output *out, const int64_t **tokens, size_t *count) {
    last_error.clear();
    if (out == nullptr || tokens == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_output_tokens_int64: out and tokens must not be NULL");
    }
    *tokens = nullptr;
    if (out->dtype != SPECRT_DTYPE_INT64) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT,
                    "specrt_output_tokens_int64: these tokens are float32 (a continuous model's latents): "
                    "read them with specrt_output_tokens_float32");
    }
    *tokens = out->ints.data();
    if (count != nullptr) {
        *count = out->ints.size();
    }
    return SPECRT_OK;
}

specrt_status specrt_output_tokens_float32(const specrt_output *out, const float **tokens, size_t *count) {
    last_error.clear();
    if (out == nullptr || tokens == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_output_tokens_float32: out and tokens must not be NULL");
    }
    *tokens = nullptr;
    if (out->dtype != SPECRT_DTYPE_FLOAT32) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT,
                    "specrt_output_tokens_float32: these tokens are int64 (VQ codebook indices): "
                    "read them with specrt_output_tokens_int64");
    }
    *tokens = out->floats.data();
    if (count != nullptr) {
        *count = out->floats.size();
    }
    return SPECRT_OK;
}

specrt_status specrt_output_images(const specrt_output *out, const uint8_t **pixels, int32_t *height,
                                   int32_t *width) {
    last_error.clear();
    if (out == nullptr || pixels == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_output_images: out and pixels must not be NULL");
    }
    *pixels = out->has_images ? out->pixels.data() : nullptr;
    if (height != nullptr) {
        *height = out->has_images ? out->height : 0;
    }
    if (width != nullptr) {
        *width = out->has_images ? out->width : 0;
    }
    return SPECRT_OK;
}

specrt_status specrt_output_stats(const specrt_output *out, specrt_stats *stats) {
    last_error.clear();
    if (out == nullptr || stats == nullptr) {
        return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_output_stats: arguments must not be NULL");
    }
    *stats = out->stats;
    return SPECRT_OK;
}

void specrt_output_free(specrt_output *out) { delete out; }

const char *specrt_last_error(void) { return last_error.c_str(); }

void specrt_close(specrt_pipeline *pipe) {
    if (pipe == nullptr) {
        return;
    }
    std::lock_guard<std::mutex> guard(call_lock);
    py::gil_scoped_acquire gil;
    delete pipe;  // drops the Python reference with the GIL held
}

}  // extern "C"
