"""Plug-ins found by dotted path (runtime/plugins.py): the object a registry names, or one line
saying which plug-in cannot be loaded and why."""
import pytest

from specrt.errors import SpecrtError
from specrt.runtime.plugins import load


def test_a_dotted_path_gives_the_object_or_the_module():
    from specrt.runtime import family_registry

    assert load("specrt.runtime.family_registry:FAMILIES", "the families") is family_registry.FAMILIES
    assert load("specrt.runtime.family_registry", "the families") is family_registry


@pytest.mark.parametrize("path, message", [
    ("specrt.no_such_layer.engines:parts", r"^the trt backend cannot be loaded: specrt.no_such_layer.engines does not "
                                           r"import \(No module named 'specrt.no_such_layer'\)$"),
    ("specrt.runtime.family_registry:NO_SUCH_NAME",
     r"^the trt backend cannot be loaded: specrt.runtime.family_registry has no NO_SUCH_NAME$"),
])
def test_a_plugin_that_cannot_be_loaded_is_one_line(path, message):
    with pytest.raises(SpecrtError, match=message):
        load(path, "the trt backend")
