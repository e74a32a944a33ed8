"""llama.cpp's C API, and the one place llmchat imports llama-cpp-python.

llama-cpp-python ships two layers: ctypes bindings of llama.cpp's C API (`llama_cpp.llama_cpp`)
and the `Llama` class on top of them. Importing the package runs its `__init__`, which imports
`Llama` and with it numpy, jinja2 and the library's chat formats: about 110 ms and 22 MiB before
any model loads, a tenth of a one-shot `ask` on a small model (bench/results/oneshot_vs_completion.md).
llmchat drives llama.cpp itself (llmchat.engine.native) and needs only the bindings.

So the package is registered without running its `__init__`, and the bindings are imported alone.
Nothing is lost for other code in the process: the first time anyone asks the package for another
name (`llama_cpp.Llama`, in a test or a script), its `__init__` runs then, on the same module
object, and the name is found as usual. Where the package was imported whole before, it is used
as it is.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType


def _register_package_lazily() -> None:
    if "llama_cpp" in sys.modules:
        return
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.loader is None:
        raise ImportError("llama-cpp-python is not installed: pip install llama-cpp-python")
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(name: str) -> object:
        # Special names (probes such as `__wrapped__`) do not complete the package: only real ones.
        if name.startswith("__") and name.endswith("__") and name not in ("__version__", "__all__"):
            raise AttributeError(name)
        del package.__dict__["__getattr__"]
        loader.exec_module(package)  # the package's own __init__, once
        return getattr(package, name)

    package.__dict__["__getattr__"] = complete
    sys.modules["llama_cpp"] = package


_register_package_lazily()

import llama_cpp.llama_cpp as llama_cpp  # noqa: E402  (after the registration above)


def _library_version() -> str:
    """llama-cpp-python's version, read from its `__init__` without running it (cache keys)."""
    package: ModuleType = sys.modules["llama_cpp"]
    version = package.__dict__.get("__version__")
    if isinstance(version, str):
        return version
    try:
        source = Path(package.__file__ or "").read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    found = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', source, re.MULTILINE)
    return found.group(1) if found else "unknown"


LIBRARY_VERSION = _library_version()


def library_module(name: str) -> ModuleType:
    """Another module of llama-cpp-python (`llama_grammar`'s schema converter), imported after the
    registration above so that it too comes without the package's `__init__`."""
    return importlib.import_module(f"llama_cpp.{name}")


__all__ = ["LIBRARY_VERSION", "library_module", "llama_cpp"]
