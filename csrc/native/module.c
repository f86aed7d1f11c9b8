/* The extension's Python face is empty on purpose: runtime/backends/native_lib.py loads this shared object with
 * ctypes and calls the plain C functions; the module exists so the build and installation are a normal
 * setuptools extension (optional: without a compiler, specedge installs and the engine reports itself missing). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef se_module = {PyModuleDef_HEAD_INIT, "_native", "specedge native engine (C kernels)", -1,
                                        NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&se_module); }
