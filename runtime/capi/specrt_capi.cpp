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
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace py = pybind11;

#ifndef SPECRT_DEFAULT_PYTHON
#define SPECRT_DEFAULT_PYTHON ""
#endif

struct specrt_pipeline {
    py::object pipe;  // a specrt.runtime.pipeline.Pipeline; touched only with the GIL held
    int32_t height = 0;
    int32_t width = 0;
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
        py::tuple result = embedding_module().attr(function)(pipe->pipe, conditions(), method, params, seed);
        std::string bytes = result[0].cast<std::string>();
        if (bytes.size() != needed) {
            return fail(SPECRT_ERR_INTERNAL, std::string(name) + ": runtime returned " + std::to_string(bytes.size()) +
                                                 " bytes, expected " + std::to_string(needed));
        }
        std::memcpy(pixels, bytes.data(), needed);
        if (stats != nullptr) {
            py::dict s = result[1];
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
        return SPECRT_OK;
    } catch (py::error_already_set &err) {
        return fail_from_python(err);
    } catch (const std::exception &exc) {
        return fail(SPECRT_ERR_INTERNAL, exc.what());
    }
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
        py::object pipe = embedding.attr("open_pipeline")(bundle_dir, backend_arg);
        py::tuple size = embedding.attr("image_size")(pipe);
        auto *handle = new specrt_pipeline;
        handle->pipe = std::move(pipe);
        handle->height = size[0].cast<int32_t>();
        handle->width = size[1].cast<int32_t>();
        *out = handle;
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
    for (size_t i = 0; i < n; ++i) {
        if (prompts[i] == nullptr) {
            return fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_generate_prompts: prompt " + std::to_string(i) + " is NULL");
        }
    }
    auto texts = [&] {  // bytes, decoded as UTF-8 on the Python side (a clear error if they are not)
        py::list out;
        for (size_t i = 0; i < n; ++i) {
            out.append(py::bytes(prompts[i]));
        }
        return out;
    };
    return generate_with("specrt_generate_prompts", "generate_rgb8_prompts", pipe, texts, n, method, params_json, seed,
                         pixels, pixels_size, stats);
}

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
