"""Python the way libraries write it (issue #16), each construct compiled next to eager with its
graph count: configs with their own __getattribute__ read through getattr / hasattr, decorators
reading the function they wrap, the frame's own **kwargs changed, set displays and `in` on sets.
The patterns are transformers' (PreTrainedConfig, merge_with_config_defaults, can_return_tuple),
written out small."""
import enum
import functools

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


class Mixin:
    def __getattribute__(self, key):
        spec = super().__getattribute__("__dict__").get("_spec")
        if spec is not None and key in spec:
            raise AttributeError(f"{key} is per layer")
        return super().__getattribute__(key)


class Config(Mixin):
    """A config that renames attributes through its own __getattribute__, as transformers' do."""
    attribute_map = {"hidden_size": "n_embd"}

    def __init__(self):
        self.n_embd = 3
        self.use_cache = True

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def reads_config(x, config):
    layer = getattr(config, "vision_feature_layer", None)  # missing: the default
    size = getattr(config, "hidden_size", 7)  # renamed to n_embd by the hook
    cache = hasattr(config, "use_cache") and hasattr(config, "not_there") is False
    return x * size + (1 if layer is None else layer) + int(cache)


def run_both(fn, *args, counter=None):
    counter = counter or CompileCounter()
    out = framejit.compile(fn, backend=counter)(*args)
    assert same(out, fn(*args))
    return counter


def test_getattr_and_hasattr_through_a_configs_own_getattribute_are_one_graph():
    config = Config()
    counter = CompileCounter()
    compiled = framejit.compile(reads_config, backend=counter)
    x = torch.randn(3)
    for _ in range(3):
        assert same(compiled(x, config), reads_config(x, config))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(reads_config)] == ["return"]
    config.vision_feature_layer = 5  # now present: the guard on the instance dict fails
    assert same(compiled(x, config), reads_config(x, config))
    assert counter.frame_count == 2


def test_an_attribute_error_raised_by_the_hook_itself_is_left_to_python():
    # The hook raises AttributeError itself (a RAISE the trace does not model): the region
    # leaves that lookup to Python, and getattr's default still comes out.
    config = Config()
    config._spec = {"hidden_size"}
    counter = run_both(reads_config, torch.randn(3), config)
    assert counter.frame_count >= 1


def test_getattr_inside_a_try_block_of_the_hook_is_left_to_python():
    class Guarded:
        def __init__(self):
            self.a = 1

        def __getattribute__(self, key):
            try:
                return object.__getattribute__(self, key)
            except AttributeError:
                return "fallback"

    def f(x, obj):
        return x + len(getattr(obj, "missing", "xy"))

    run_both(f, torch.randn(2), Guarded())  # "fallback": 8 characters, not 2


def wraps_and_reads(func):
    @functools.wraps(func)
    def wrapper(self_or_x, *args, **kwargs):
        name = func.__name__
        if "scale" in func.__code__.co_varnames:
            kwargs.setdefault("scale", 2.0)
        out = func(self_or_x, *args, **kwargs)
        return out + len(name)
    return wrapper


@wraps_and_reads
def scaled(x, scale=1.0):
    return x * scale


def test_a_decorator_reading_the_wrapped_functions_name_and_code_is_one_graph():
    counter = CompileCounter()
    compiled = framejit.compile(scaled, backend=counter)
    x = torch.randn(3)
    for _ in range(2):
        assert same(compiled(x), scaled(x))
        assert same(compiled(x, scale=3.0), scaled(x, scale=3.0))
    assert counter.frame_count == 2  # the keywords given differ: two regions, no break


def test_a_renamed_function_compiles_again():
    def inner(x):
        return x * 2

    def f(x, fn):
        return fn(x) + len(fn.__name__)

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.randn(2)
    assert same(compiled(x, inner), f(x, inner))
    inner.__name__ = "a_much_longer_name"
    assert same(compiled(x, inner), f(x, inner))
    assert counter.frame_count == 2


OUTPUT_KEYS = {"hidden_states", "attentions"}


class Named(torch.nn.Module):
    def forward(self, x):
        seen = {k for k in ("a", "c", "a")}  # a set comprehension
        table = {1, 2, *seen}  # a display with an unpacked set
        hits = ("attentions" in OUTPUT_KEYS) + ("loss" in OUTPUT_KEYS) + ("c" in seen)
        return x * len(table) + hits + len(self.__class__.__name__)


def test_set_displays_comprehensions_and_in_on_a_global_set_are_one_graph():
    model = Named()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.randn(3)
    for _ in range(2):
        assert same(compiled(x), model(x))
    assert counter.frame_count == 1
    OUTPUT_KEYS.add("loss")  # the set changed in place: its guard fails, no stale answer
    try:
        assert same(compiled(x), model(x))
        assert counter.frame_count == 2
    finally:
        OUTPUT_KEYS.discard("loss")


def test_a_set_of_tensors_is_left_to_python():
    def f(x):
        s = {x, x * 2}
        return len(s) * x

    run_both(f, torch.randn(2))


class Action(enum.Enum):  # compares as object does: `==` is `is`, guarded
    NONE = "none"
    RAISE = "raise"


class Mode(str, enum.Enum):  # transformers' ExplicitEnum: compares as str, guarded by value
    NONE = "none"
    NOTIFY = "notify"


def by_identity(x, action):
    if action == Action.NONE and action in (Action.NONE, Action.RAISE):
        return x + 1
    return x - 1


def by_value(x, mode):
    if mode != Mode.NONE and mode == "notify" and mode in (Mode.NOTIFY,):
        return x + 1
    return x - 1


@pytest.mark.parametrize("f,members", [(by_identity, list(Action)), (by_value, list(Mode))],
                         ids=["enum", "str_enum"])
def test_enum_members_compare_in_the_trace_one_graph_per_member(f, members):
    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.zeros(2)
    for member in members + members:
        assert same(compiled(x, member), f(x, member))
    assert counter.frame_count == 2 and all(r["exit"] == "return" for r in regions(f))


def test_hasattr_on_a_tensor_is_guarded_on_its_own_dict():
    def f(x):
        if not hasattr(x, "jax"):  # transformers' is_jax_jitting
            return x + 1
        return x - 1

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.zeros(2)
    assert same(compiled(x), f(x)) and counter.frame_count == 1
    x.jax = True
    assert same(compiled(x), f(x))  # the guard fails: compiled again for this tensor
    assert counter.frame_count == 2


def _breaks(x):
    print("a call the trace leaves to Python")
    return 1


def test_a_containers_bound_method_kept_across_a_break_is_traced():
    # `d.get` is loaded, then its argument breaks: the next region starts with the bound
    # method on the stack, and reads the dict through it.
    def f(x, d):
        return d.get("k", _breaks(x)) + x * 2

    counter = run_both(f, torch.randn(2), {"k": 3})
    assert counter.frame_count == 1


class Layers:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def test_len_through_a_classs_own_len_is_one_graph_and_guarded():
    def f(x, layers):
        return x * len(layers)

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.ones(2)
    layers = Layers(3)
    assert same(compiled(x, layers), f(x, layers)) and counter.frame_count == 1
    layers.n = 4  # what __len__ read is guarded
    assert same(compiled(x, layers), f(x, layers)) and counter.frame_count == 2


class Slotted:
    __slots__ = ("scale", "unset")

    def __init__(self, scale):
        self.scale = scale


def test_a_slot_of_an_object_passed_in_is_read_and_guarded():
    def f(x, obj):
        return x * obj.scale

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x, obj = torch.ones(2), Slotted(2.0)
    assert same(compiled(x, obj), f(x, obj)) and counter.frame_count == 1
    obj.scale = 3.0  # the slot's value is guarded: a new value compiles again, no stale result
    assert same(compiled(x, obj), f(x, obj)) and counter.frame_count == 2
    with pytest.raises(AttributeError):
        framejit.compile(lambda x, o: x * o.unset, backend="eager")(x, obj)


def test_dataclasses_fields_is_traced_as_transformers_model_outputs_use_it():
    import dataclasses

    @dataclasses.dataclass
    class Output:
        logits: torch.Tensor
        loss: torch.Tensor = None

    def f(x, out):
        names = {field.name for field in dataclasses.fields(out)}  # ModelOutput.__setattr__
        return x * len(names) if "logits" in names else x

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    out = Output(torch.zeros(1))
    x = torch.ones(2)
    assert same(compiled(x, out), f(x, out))
    assert counter.frame_count == 1 and all(not r["reason"] for r in regions(f) if r["graph"])
