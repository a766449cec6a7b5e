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


def set_methods(x):
    seen = {1, 2}
    seen.add(3)
    seen.update([4, x.shape[0]])  # a size: pinned, as any set item
    seen.discard(1)
    wanted = set(["a", "b"]) | {"c"}
    both = seen.union(set(range(3))).intersection({0, 3, 4})
    return (x * len(seen) + len(both) if seen.issuperset({3, 4}) and "c" in wanted else x), seen


def test_set_calls_and_methods_on_sets_the_trace_made_are_one_graph():
    # set(...) and frozenset(...) of constants, and set methods on a set the trace made (its
    # object is the trace's own: changed in place, copied where it leaves the region).
    counter = run_both(set_methods, torch.randn(3))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(set_methods)] == ["return"]
    out = framejit.compile(set_methods, backend=CompileCounter())(torch.randn(5))[1]
    assert out == {2, 3, 4, 5}


def test_a_method_changing_a_set_that_existed_before_is_left_to_python():
    def f(x):
        OUTPUT_KEYS.add("extra")
        return x * len(OUTPUT_KEYS)

    try:
        before = set(OUTPUT_KEYS)
        compiled = framejit.compile(f, backend=CompileCounter())
        compiled(torch.ones(2))
        assert OUTPUT_KEYS == before | {"extra"}  # changed once, as eager changes it
    finally:
        OUTPUT_KEYS.discard("extra")


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


# ---------------------------------------------------------------------------------------------
# Mapping subclasses made and used in the trace (transformers' ModelOutput), registries that are
# dict subclasses, properties read through getattr / hasattr, and the small builtins around them
# ---------------------------------------------------------------------------------------------

import collections  # noqa: E402
import dataclasses  # noqa: E402


class _NamedMeta(type):
    """A metaclass that leaves instance creation to type.__call__ (ModelOutput has one)."""

    def __setattr__(cls, name, value):
        super().__setattr__(name, value)


class Output(collections.OrderedDict, metaclass=_NamedMeta):
    """ModelOutput written out small: a dataclass whose fields are both attributes and items,
    kept in step by its own __setattr__ / __setitem__ through super()."""

    def __post_init__(self):
        names = [f.name for f in dataclasses.fields(self)]
        for name in names:
            value = self.__dict__.get(name)
            if value is not None:
                self[name] = value

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def __contains__(self, key):
        return super().__contains__(key)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class LMOutput(Output):
    logits: torch.Tensor = None
    loss: torch.Tensor = None
    hidden_states: tuple = None


def makes_and_reads_an_output(x):
    out = LMOutput(logits=x * 2, hidden_states=(x,))
    first = out[0] + out["hidden_states"][0] + out.logits
    return first * len(out) + len(out.to_tuple()), "loss" in out, list(out.keys())


def returns_an_output(x):
    inner = LMOutput(logits=x + 1)
    return LMOutput(logits=inner.logits * 3, loss=inner[0].sum())


def test_a_dict_subclass_dataclass_made_in_the_trace_is_one_graph():
    counter = run_both(makes_and_reads_an_output, torch.randn(3))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(makes_and_reads_an_output)] == ["return"]


def test_a_dict_subclass_made_in_the_trace_and_returned_is_rebuilt_as_eager_makes_it():
    counter = CompileCounter()
    compiled = framejit.compile(returns_an_output, backend=counter)
    x = torch.randn(3)
    out, expected = compiled(x), returns_an_output(x)
    assert type(out) is LMOutput and list(out.keys()) == list(expected.keys()) == ["logits", "loss"]
    assert same(dict(out), dict(expected)) and same(out.logits, expected.logits)
    assert out.hidden_states is None and same(out.to_tuple(), expected.to_tuple())
    assert counter.frame_count == 1 and compiled(x) is not out  # a fresh object per call


def reads_an_output_passed_in(out):
    # What a loss function or a training loop does with a model's output made outside.
    total = out[0] * 2 + out["logits"].sum() + out.to_tuple()[0].sum()
    scaled = {k: v * 2 for k, v in out.items() if isinstance(v, torch.Tensor)}
    return total, scaled, list(out), [k for k in out.keys()], "loss" in out, len(out)


class Ordered(collections.OrderedDict):
    """A user OrderedDict subclass that changes nothing about reading it."""


def reads_an_ordered_dict(d):
    it = iter(d)
    first = next(it)
    return [v * 2 for v in d.values()], sorted(d), d[first] * 2 + d[next(it)], "b" in d, first


def test_a_dict_subclass_passed_in_is_read_through_its_own_items_and_guarded():
    counter = CompileCounter()
    compiled = framejit.compile(reads_an_output_passed_in, backend=counter)
    out = LMOutput(logits=torch.randn(3), loss=torch.randn(()))
    assert same(compiled(out), reads_an_output_passed_in(out))
    assert same(compiled(out), reads_an_output_passed_in(out))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(reads_an_output_passed_in)] == ["return"]
    out.hidden_states = (torch.randn(2),)  # a new key: not the traced one
    assert same(compiled(out), reads_an_output_passed_in(out))
    assert counter.frame_count == 2
    out = LMOutput(logits=torch.randn(3))  # no loss: its own graph
    assert same(compiled(out), reads_an_output_passed_in(out))
    assert counter.frame_count == 3

    counter = CompileCounter()
    compiled = framejit.compile(reads_an_ordered_dict, backend=counter)
    d = Ordered(a=torch.randn(2), b=torch.randn(2))
    assert same(compiled(d), reads_an_ordered_dict(d))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(reads_an_ordered_dict)] == ["return"]
    d.move_to_end("a")  # the same keys in another order: compiled again, never stale
    assert same(compiled(d), reads_an_ordered_dict(d))
    assert counter.frame_count == 2
    d["b"] = torch.ones(2)  # a value replaced: the same graph reads the new one
    assert same(compiled(d), reads_an_ordered_dict(d))
    assert counter.frame_count == 2
    Ordered.__iter__ = lambda self: iter(sorted(super(Ordered, self).__iter__()))  # a, b
    try:  # the class's iteration changed: the guards see it, never a stale first key
        assert same(compiled(d), reads_an_ordered_dict(d))
        assert compiled(d)[-1] == "a"  # (its own order is b, a since move_to_end)
    finally:
        del Ordered.__iter__


class Registry(dict):
    """A registry that is a dict subclass (transformers' attention / output-capture ones)."""

    def get(self, key, default=None):
        return super().get(key) or default


REGISTRY = Registry(scale={"factor": 2.0})


def reads_a_registry(x):
    entry = REGISTRY.get("scale", {})
    return x * entry["factor"] if entry else x


def test_super_get_of_a_dict_subclass_registry_is_read_and_guarded():
    counter = CompileCounter()
    compiled = framejit.compile(reads_a_registry, backend=counter)
    x = torch.ones(2)
    assert same(compiled(x), reads_a_registry(x)) and counter.frame_count == 1
    REGISTRY["scale"] = {"factor": 5.0}  # the registry changed: no stale result
    assert same(compiled(x), reads_a_registry(x)) and counter.frame_count == 2
    del REGISTRY["scale"]  # missing now: the default (the region then makes no graph)
    try:
        assert same(compiled(x), reads_a_registry(x))
    finally:
        REGISTRY["scale"] = {"factor": 2.0}


class Interface(collections.abc.MutableMapping):
    """A Mapping subclass whose .get is collections.abc's mixin (a frozen module on 3.11)."""
    _defaults = {"sdpa": 2.0}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        return self._local[key] if key in self._local else self._defaults[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter(self._defaults)

    def __len__(self):
        return len(self._defaults)

    def get_interface(self, key, default):
        return super().get(key, default)


INTERFACES = Interface()


def reads_an_interface(x):
    return x * INTERFACES.get_interface("sdpa", 1.0)


def test_the_collections_abc_mixin_get_is_traced():
    counter = run_both(reads_an_interface, torch.ones(2))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(reads_an_interface)] == ["return"]


class Cache:
    def __init__(self):
        self.layers = []

    @property
    def is_compileable(self):
        return len(self.layers) > 0

    @property
    def broken(self):
        return self.not_there  # AttributeError: hasattr is False, getattr gives the default


def reads_properties(x, cache):
    a = getattr(cache, "is_compileable", False)
    b = hasattr(cache, "broken")
    c = getattr(cache, "broken", 3)
    return x * (2 if a else 1) + int(b) + c


def test_getattr_and_hasattr_of_a_property_run_its_getter_in_the_trace():
    cache = Cache()
    counter = CompileCounter()
    compiled = framejit.compile(reads_properties, backend=counter)
    x = torch.ones(2)
    assert same(compiled(x, cache), reads_properties(x, cache)) and counter.frame_count == 1
    cache.layers.append(1)  # the getter's answer changes: guarded
    assert same(compiled(x, cache), reads_properties(x, cache))


def small_builtins(x, **kwargs):
    keep = slice(None, 2)
    d = dict(kwargs, extra=1)
    pairs = dict([("a", 1), ("b", 2)])
    flag = torch.compiler.is_exporting()
    y = add_all(*(), **{"t": x[keep]})
    return y * (d["extra"] + pairs["b"]) + int(flag), d, (x,) is None


def add_all(t):
    return t + 1


def test_slice_dict_exporting_flag_and_star_call_with_constant_tuple_are_one_graph():
    counter = CompileCounter()
    compiled = framejit.compile(small_builtins, backend=counter)
    x = torch.randn(4)
    assert same(compiled(x, z=3), small_builtins(x, z=3))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(small_builtins)] == ["return"]


def compares_derived_sizes(x, past=0):
    q = x.shape[1]
    k = q + past
    if q == 1 or k == q:  # k == q whatever the size: no guard on it
        x = x + 1
    if q > 1 and k > q:
        x = x * 2
    return x


def test_a_comparison_of_sizes_that_cancel_pins_no_size():
    counter = CompileCounter()
    compiled = framejit.compile(compares_derived_sizes, backend=counter)
    for n in (4, 5, 6, 7):
        x = torch.randn(2, n)
        assert same(compiled(x), compares_derived_sizes(x))
    assert counter.frame_count == 1
    x = torch.randn(2, 1)  # q == 1: the range guard (q > 1) fails, one more graph
    assert same(compiled(x), compares_derived_sizes(x)) and counter.frame_count == 2


class Empty:
    def __len__(self):
        return 0


def truth_of_an_object_made_here(x):
    return x + 1 if Empty() else x - 1  # False: its __len__ decides, not object's default


def test_the_truth_of_an_object_made_in_the_trace_is_its_classs():
    run_both(truth_of_an_object_made_here, torch.ones(2))


class Layer:
    def __init__(self):
        self.scale = 3.0

    def chunk(self, t):
        return t * self.scale


def applies_a_bound_method(forward_fn, x):
    # transformers' apply_chunking_to_forward: the signature is asked, then the method called
    import inspect
    if len(inspect.signature(forward_fn).parameters) != 1:
        raise ValueError("one argument expected")
    return forward_fn(x) + 1


def test_a_bound_method_passed_in_is_traced_and_its_signature_is_a_constant():
    layer = Layer()
    counter = CompileCounter()
    compiled = framejit.compile(applies_a_bound_method, backend=counter)
    x = torch.ones(2)
    assert same(compiled(layer.chunk, x), applies_a_bound_method(layer.chunk, x))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(applies_a_bound_method)] == ["return"]
    layer.scale = 4.0  # read through the method's self, by source: guarded
    assert same(compiled(layer.chunk, x), applies_a_bound_method(layer.chunk, x))


class Renaming:
    """A config whose own __setattr__ renames and transforms what is stored (BC renames,
    validators): the trace runs it, so later reads see what it stored."""

    def __setattr__(self, name, value):
        if name == "old":
            name = "new"
        super().__setattr__(name, value * 2)


RENAMING = Renaming()
RENAMING.new = 1


def writes_through_own_setattr(x):
    RENAMING.old = 3
    return x * RENAMING.new


def test_a_store_runs_the_classs_own_setattr_and_later_reads_see_its_store():
    counter = CompileCounter()
    compiled = framejit.compile(writes_through_own_setattr, backend=counter)
    x = torch.ones(2)
    out = compiled(x)
    assert vars(RENAMING) == {"new": 6}
    RENAMING.new = 1
    assert same(out, writes_through_own_setattr(x)) and vars(RENAMING) == {"new": 6}
    assert counter.frame_count == 1


def makes_a_loss_module(x, y):
    loss_fct = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    act = torch.nn.GELU(approximate="tanh")
    return loss_fct(act(x), y), act


def test_a_stateless_module_made_in_the_forward_is_traced_and_fresh_per_call():
    counter = CompileCounter()
    compiled = framejit.compile(makes_a_loss_module, backend=counter)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    (loss, act), (ref, ref_act) = compiled(x, y), makes_a_loss_module(x, y)
    assert same(loss, ref) and type(act) is torch.nn.GELU and act.approximate == "tanh"
    assert compiled(x, y)[1] is not act  # a new module each call, as eager makes
    assert counter.frame_count == 1 and [r["exit"] for r in regions(makes_a_loss_module)] == ["return"]


class ScaledGelu(torch.nn.Module):
    """A library's activation module (transformers' ACT2FN["gelu"] makes one per call)."""

    def __init__(self, scale=1.0, approximate="none"):
        super().__init__()
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        self.scale = scale
        self.act = functools.partial(torch.nn.functional.gelu, approximate=approximate)

    def forward(self, x):
        return self.act(x) * self.scale


ACTIVATIONS = {"gelu": (ScaledGelu, {"scale": 2.0}), "gelu_tanh": (ScaledGelu, {"approximate": "tanh"})}


def makes_a_library_activation(x, name):
    cls, kwargs = ACTIVATIONS[name]
    act = cls(**kwargs)
    return act(x), act


def test_a_user_module_whose_constructor_writes_only_itself_is_made_in_the_trace():
    counter = CompileCounter()
    compiled = framejit.compile(makes_a_library_activation, backend=counter)
    x = torch.randn(4, 3)
    torch.compile(torch.neg, backend="eager")(x)  # Dynamo patches Module.__init__ when it runs
    for name in ("gelu", "gelu_tanh"):
        (out, act), (ref, ref_act) = compiled(x, name), makes_a_library_activation(x, name)
        assert same(out, ref) and type(act) is ScaledGelu and act.scale == ref_act.scale
        assert compiled(x, name)[1] is not act  # a new module each call, as eager makes
    assert counter.frame_count == 2
    assert {r["exit"] for r in regions(makes_a_library_activation)} == {"return"}


MADE = []


class CountedGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        MADE.append(self)  # a constructor that changes more than the new module

    def forward(self, x):
        return torch.nn.functional.gelu(x)


class LoggedGelu(torch.nn.Module):
    def __init__(self, log):
        super().__init__()
        self.log = log
        self.note()  # a call into code of its own: not run at trace time

    def note(self):
        MADE.append("note")

    def forward(self, x):
        return torch.nn.functional.gelu(x)


class TriedGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        try:  # a handler that could catch a refusal and go on: not run at trace time
            MADE.append("tried")
        except RuntimeError:
            pass

    def forward(self, x):
        return torch.nn.functional.gelu(x)


def makes_modules_with_side_effects(x):
    return CountedGelu()(x) + LoggedGelu("a")(x) + TriedGelu()(x)


def test_a_user_module_whose_constructor_changes_other_state_runs_in_python_every_call():
    MADE.clear()
    compiled = framejit.compile(makes_modules_with_side_effects, backend=CompileCounter())
    x = torch.randn(3)
    for calls in (1, 2, 3):
        assert same(compiled(x), makes_modules_with_side_effects(x))
        assert len(MADE) == 6 * calls  # eager's and the compiled call's constructors both ran


@functools.lru_cache
def version_at_least(major, minor):
    CACHE_CALLS.append((major, minor))
    return tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (major, minor)


CACHE_CALLS = []


def uses_a_cached_check(x):
    if version_at_least(2, 0):  # transformers' is_torch_greater_or_equal("2.9")
        return x + 1
    return x - 1


def test_an_lru_cached_function_of_constants_is_called_once_and_folded():
    counter = CompileCounter()
    compiled = framejit.compile(uses_a_cached_check, backend=counter)
    x = torch.randn(3)
    for _ in range(3):
        assert same(compiled(x), uses_a_cached_check(x))
    assert counter.frame_count == 1 and CACHE_CALLS == [(2, 0)]
    assert [r["exit"] for r in regions(uses_a_cached_check)] == ["return"]


@functools.cache
def rotary_table(n):
    return torch.arange(n).float() / n


def adds_a_cached_table(x):
    return x + rotary_table(4)


def test_an_lru_cached_function_returning_a_tensor_is_traced_through_as_torch_compile_does():
    # A real tensor is no constant of the trace (this was a deopt: the meta op met a CPU tensor);
    # the function the cache wraps is traced, so the graph computes the table (a side effect
    # of the function would then repeat each call, as under torch.compile).
    counter = CompileCounter()
    compiled = framejit.compile(adds_a_cached_table, backend=counter)
    x = torch.randn(4)
    for _ in range(3):
        assert same(compiled(x), adds_a_cached_table(x))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(adds_a_cached_table)] == ["return"]
    assert "torch.arange(4)" in counter.graphs[0].code


class _Recipe:
    """What einops' cached parser returns: a plain object, read attribute by attribute."""

    def __init__(self, order):
        self.order = list(order)
        self.rank = len(self.order)


PARSES = []


@functools.lru_cache(64)
def parse(pattern):
    PARSES.append(pattern)
    return _Recipe(int(c) for c in pattern)


@functools.lru_cache(64)
def merged_shape(recipe, shape):
    # Called with the tensor's sizes: traced (its __wrapped__), so the sizes stay the graph's.
    first, *rest = shape
    out = first
    for size in rest:
        out = out * size
    return (out,)


def permute_by_pattern(x, pattern):
    recipe = parse(pattern)
    y = x.permute(*recipe.order) if recipe.rank == x.dim() else x
    return y.reshape(merged_shape(recipe, y.shape))


def test_an_lru_cached_function_returning_an_object_and_one_of_sizes():
    PARSES.clear()
    counter = CompileCounter()
    compiled = framejit.compile(permute_by_pattern, backend=counter)
    for shape in [(2, 3, 4), (2, 3, 4), (5, 3, 4)]:
        x = torch.randn(shape)
        assert same(compiled(x, "210"), permute_by_pattern(x, "210"))
    # The recipe is the cached object (parsed once, by the first call's trace); merged_shape's
    # body is traced with the sizes as graph values: one graph for every batch size.
    assert PARSES == ["210"]
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(permute_by_pattern)] == ["return"]


NOTED = []


@functools.lru_cache
def note_once(config):
    NOTED.append(config.name)  # a "warn once" helper: the cache runs it once per config


class _NamedConfig:
    name = "cfg"


def uses_note_once(x, config):
    note_once(config)
    return x + 1


def test_an_lru_cached_helper_of_an_object_runs_once_as_the_cache_runs_it():
    # Traced through its __wrapped__ on every call, its side effect would repeat; it is called
    # as Python calls it (a break), so the cache decides.
    NOTED.clear()
    config = _NamedConfig()
    compiled = framejit.compile(uses_note_once, backend=CompileCounter())
    x = torch.randn(2)
    for _ in range(3):
        assert same(compiled(x, config), x + 1)
    assert NOTED == ["cfg"]


class _TorchBackend:
    name = "torch"


class _NumpyBackend:
    name = "numpy"


# einops' _type2backend: backends by the class of the tensor (classes hash by identity).
_BACKENDS = {torch.Tensor: _TorchBackend(), int: _NumpyBackend()}


def by_type(x):
    kind = type(x)
    backend = _BACKENDS.get(kind, None)
    if kind in _BACKENDS and _BACKENDS[kind] is backend and backend.name == "torch":
        return x * 2
    return x * 3


def test_a_dict_keyed_by_classes_is_read_with_the_class_of_a_value():
    counter = CompileCounter()
    compiled = framejit.compile(by_type, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x), x * 2)
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(by_type)] == ["return"]
    _BACKENDS[torch.Tensor] = _NumpyBackend()  # the entry is guarded: compiled again
    try:
        assert same(compiled(x), x * 3) and counter.frame_count == 2
    finally:
        _BACKENDS[torch.Tensor] = _TorchBackend()


def scans(x):
    if torch.compiler.is_compiling():
        from torch._higher_order_ops.associative_scan import associative_scan
        return associative_scan(lambda a, b: a + b, x, dim=0, combine_mode="generic")
    return x.cumsum(0)


def test_a_higher_order_op_on_a_compile_only_path_is_traced_on_the_eager_path():
    counter = CompileCounter()
    compiled = framejit.compile(scans, backend=counter)
    x = torch.randn(5, 2)
    assert same(compiled(x), x.cumsum(0)) and counter.frame_count == 1
    assert [r["exit"] for r in regions(scans)] == ["return"]


def makes_a_linear(x):
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)(x)  # holds parameters: left to Python, the RNG untouched


def test_a_module_with_parameters_made_in_the_forward_is_left_to_python_with_the_same_rng():
    x = torch.randn(4, 3)
    torch.manual_seed(1)
    out = framejit.compile(makes_a_linear, backend=CompileCounter())(x)
    after = torch.rand(1)
    torch.manual_seed(1)
    assert same(out, makes_a_linear(x)) and same(after, torch.rand(1))


def reads_the_environment(x):
    import os
    forced = os.environ.get("FRAMEJIT_TEST_FORCE", "0") == "1"
    home = "FRAMEJIT_TEST_HOME" in os.environ
    return x + 1 if forced else x - 1, home


def test_os_environ_reads_are_one_graph_and_guarded():
    import os
    os.environ.pop("FRAMEJIT_TEST_FORCE", None)
    os.environ.pop("FRAMEJIT_TEST_HOME", None)
    counter = CompileCounter()
    compiled = framejit.compile(reads_the_environment, backend=counter)
    x = torch.ones(2)
    try:
        assert same(compiled(x), reads_the_environment(x)) and counter.frame_count == 1
        os.environ["FRAMEJIT_TEST_FORCE"] = "1"  # a new value: no stale result
        os.environ["FRAMEJIT_TEST_HOME"] = ""
        assert same(compiled(x), reads_the_environment(x)) and counter.frame_count == 2
        assert {r["exit"] for r in regions(reads_the_environment)} == {"return"}
    finally:
        os.environ.pop("FRAMEJIT_TEST_FORCE", None)
        os.environ.pop("FRAMEJIT_TEST_HOME", None)


def makes_mask_functions(x, pad):
    def causal(i):
        return i >= 0

    def padding(i):
        return pad[i] if False else i < 100

    fns = (causal, padding)
    if not all(callable(f) for f in fns) or callable(x):  # transformers' and_masks
        raise RuntimeError("not callable")
    return x * 2


def test_callable_answers_from_the_values_kind():
    run_both(makes_mask_functions, torch.ones(2), torch.ones(3))


def pick(mapping, key):  # a shared helper, inlined through two call paths
    return mapping[key]


class Frames:
    def __getitem__(self, key):
        import sys
        return sys._getframe().f_lineno * 0 + key  # sys._getframe is not traced: a break


class Table:
    def __getitem__(self, key):
        return {"b": 3}[key]


GOOD = Table()  # its __getitem__ is inlined through pick, as Frames' is


def shares_a_helper(x):
    a = pick(GOOD, "b")  # traced
    b = pick(Frames(), 2)  # breaks inside Frames.__getitem__: this call is left to Python
    return x * a * b


def test_a_shared_helper_that_breaks_through_one_call_path_stays_inlined_through_another():
    run_both(shares_a_helper, torch.ones(2))
    # Region 1 traces the first pick (through Table.__getitem__) and ends at the second; the
    # runtime makes that call; region 2 returns. Keyed by pick's subscript alone, the first
    # pick would not have been inlined either: one more region.
    assert [r["exit"] for r in regions(shares_a_helper)] == ["call", "return"]


# --- builtins and itertools run through their Python forms (_python_forms.py) -----------------

import collections  # noqa: E402
import itertools  # noqa: E402
import operator  # noqa: E402
import typing  # noqa: E402

Pair = collections.namedtuple("Pair", "first second", defaults=(1,))


class Shape(typing.NamedTuple):
    batch: int
    length: int = 4


def gpt_fast_transposes(q, k, v):
    q, k, v = map(lambda t: t.transpose(1, 2), (q, k, v))  # gpt-fast's attention
    return q @ k.transpose(-1, -2) @ v


def functional_builtins(x):
    kept = list(filter(lambda n: n % 2, range(5)))
    nonzero = list(filter(None, [0, 2, 0, 3]))
    total = functools.reduce(lambda a, b: a + b, [x, x * 2, x * 3])
    product = functools.reduce(operator.mul, kept, 1)
    return total * product + sum(nonzero)


def itertools_forms(x):
    out = x
    for a, b in itertools.combinations([1, 2, 3], 2):
        out = out + a * b
    for a, b in itertools.zip_longest([1, 2], [3], fillvalue=0):
        out = out - a + b
    for a in itertools.chain([1], (2, 3)):
        out = out * a
    for a, b in itertools.product([1, 2], repeat=2):
        out = out + a - b
    for t in itertools.chain.from_iterable([[x], [x * 2]]):
        out = out + t
    return out + sum(itertools.accumulate([1, 2, 3])) + list(itertools.accumulate([x, x], initial=x))[2]


def getters_and_tuples(x):
    d = {"a": x, "b": 2}
    first, scale = operator.itemgetter("a", "b")(d)
    rows = operator.attrgetter("shape")(x)[0]
    pair = Pair(x)
    shape = Shape(batch=2)
    it = iter([x, x + 1])
    head = next(it)
    rest = []
    rest.extend(it)
    return first * scale * rows + pair.first * pair.second + shape.batch * shape.length + head + rest[0] + next(it, 3)


def type_names(x):
    y = x.type(torch.float64)
    return y * 2 if x.type() == "torch.FloatTensor" else y


def partials_of_traced_values(x, w):
    scale = functools.partial(torch.mul, w * 2)  # a partial of a value the trace made
    add_to = functools.partial(torch.add, alpha=2)
    twice = functools.partial(scale)  # flattened into one partial, as functools does
    return twice(x) + add_to(x, other=w) + len(scale.args) + scale.func(x, 1)


def test_a_partial_of_traced_values_is_one_graph_and_leaves_the_region_as_a_partial():
    def f(x):
        return functools.partial(torch.sub, x * 3, alpha=2)

    out = framejit.compile(f, backend=CompileCounter())(torch.ones(2))
    assert type(out) is functools.partial and out.keywords == {"alpha": 2}
    assert same(out(torch.ones(2)), f(torch.ones(2))(torch.ones(2)))
    assert [r["exit"] for r in regions(f)] == ["return"]


def keyed_builtins(x, y):
    # sorted / min / max with key=: by sizes (numbers the trace knows) and by names; equal keys
    # keep their order, as in CPython.
    by_rows = sorted([y, x, x * 2], key=lambda t: t.shape[0])
    widest = max(x, y, key=lambda t: t.shape[-1])
    narrowest = min([y, x], key=lambda t: t.shape[-1], default=None)
    names = sorted({"b": y, "a": x}.items(), key=operator.itemgetter(0), reverse=True)
    return by_rows[0].sum() + by_rows[1].sum() * 2 + widest.sum() * 3 + narrowest.sum() + names[0][1].sum()


@pytest.mark.parametrize("fn,make", [
    (gpt_fast_transposes, lambda: tuple(torch.randn(2, 3, 4, 5) for _ in range(3))),
    (keyed_builtins, lambda: (torch.randn(2, 3), torch.randn(4, 5))),
    (partials_of_traced_values, lambda: (torch.randn(3), torch.randn(3))),
    (functional_builtins, lambda: (torch.randn(3),)),
    (itertools_forms, lambda: (torch.randn(3),)),
    (getters_and_tuples, lambda: (torch.randn(3),)),
    (type_names, lambda: (torch.randn(3),)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_builtins_through_their_python_forms_are_one_graph(fn, make):
    counter = run_both(fn, *make())
    assert counter.frame_count == 1 and [r["exit"] for r in regions(fn)] == ["return"]


def test_map_stays_lazy_and_a_namedtuple_leaves_the_region_as_itself():
    seen = []

    def f(x):
        lazy = map(lambda t: seen.append(t) or t * 2, [x, x + 1])
        first = next(lazy)
        return Pair(first, len(seen))

    out = framejit.compile(f, backend=CompileCounter())(torch.ones(2))
    assert type(out) is Pair and out.second == 1  # the second item was never made
    assert same(out.first, torch.ones(2) * 2)


def init_scaled(w, x):
    # Initialisation arithmetic in a forward (transformers' and timm's init helpers read it).
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(w)
    gain = torch.nn.init.calculate_gain("leaky_relu", 0.2)
    fan = torch.nn.init._calculate_correct_fan(w, "fan_in")
    return x @ w.t() * (gain * (2.0 / (fan_in + fan_out)) ** 0.5 / fan)


def autocast_dtype_named(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = torch.get_autocast_dtype("cpu")
    return x.to(inside).float() * 2, x.to(torch.get_autocast_dtype("cpu"))


def test_init_helpers_and_the_autocast_dtype_are_answered_in_the_trace():
    counter = run_both(init_scaled, torch.randn(3, 4), torch.randn(2, 4))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(init_scaled)] == ["return"]
    counter = CompileCounter()
    compiled = framejit.compile(autocast_dtype_named, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x), autocast_dtype_named(x))
    assert compiled(x)[1].dtype == torch.get_autocast_dtype("cpu")
    before = torch.get_autocast_dtype("cpu")
    try:  # the dtype is a constant of the trace: a change of it compiles again
        torch.set_autocast_dtype("cpu", torch.float16)
        out = compiled(x)
        assert out[1].dtype == torch.float16 and same(out, autocast_dtype_named(x))
    finally:
        torch.set_autocast_dtype("cpu", before)
    assert counter.frame_count == 2
    assert [r["exit"] for r in regions(autocast_dtype_named)] == ["return", "return"]


def groups_by_parity(x):
    groups = collections.defaultdict(list)
    counts = collections.defaultdict(int)
    seen = collections.defaultdict()  # no factory: a missing key raises, as for a dict
    for i, t in enumerate([x, x * 2, x * 3]):
        groups[i % 2].append(t)
        counts[i % 2] += 1
    try:
        seen["missing"]
    except KeyError:
        seen["caught"] = True
    mean = sum(sum(v) / counts[k] for k, v in groups.items())
    return mean, groups, counts, seen, isinstance(groups, collections.defaultdict), type(counts)


def test_a_defaultdict_made_in_the_trace_is_one_graph_and_leaves_as_a_defaultdict():
    counter = CompileCounter()
    compiled = framejit.compile(groups_by_parity, backend=counter)
    x = torch.randn(3)
    out, expected = compiled(x), groups_by_parity(x)
    assert same(out[0], expected[0]) and out[4:] == expected[4:]
    for made, eager in zip(out[1:4], expected[1:4]):
        assert type(made) is collections.defaultdict
        assert made.default_factory is eager.default_factory
        assert same(dict(made), dict(eager))
    out[1]["new"].append(1)  # still a defaultdict of lists after the exit
    assert out[1]["new"] == [1]
    assert compiled(x)[1] is not out[1]  # a fresh one per call
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(groups_by_parity)] == ["return"]


class KeysHidden(dict):
    """Overrides keys() and __len__ but not __iter__: `for k in d` is still dict's iteration."""

    def keys(self):
        return ["hidden"]

    def __len__(self):
        return 99


def iterates_and_measures(d):
    return [d[k] * 2 for k in d], list(d.keys()), len(d)


def copies_a_defaultdict(x):
    groups = collections.defaultdict(list)
    groups["a"].append(x)
    again = groups.copy()
    again["b"].append(x * 2)  # the copy is a defaultdict too
    return again["a"][0] + again["b"][0], type(again)


def test_a_dict_subclass_overriding_some_methods_is_read_by_the_ones_it_keeps():
    d = KeysHidden(a=torch.randn(2), b=torch.randn(2))
    counter = run_both(iterates_and_measures, d)
    assert counter.frame_count == 1
    assert framejit.compile(iterates_and_measures)(d)[1:] == (["hidden"], 99)
    counter = run_both(copies_a_defaultdict, torch.randn(2))
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(copies_a_defaultdict)] == ["return"]


def counts_with_a_lambda(x):
    counts = collections.defaultdict(lambda: 0)
    sets = collections.defaultdict(set)
    for k in ["a", "b", "a"]:
        counts[k] += 1
        sets[k].add(len(k))
    made = collections.defaultdict(lambda: [x])  # the factory reads the frame's tensor
    made["t"].append(x * 2)
    return x * counts["a"] + counts["b"], made, len(sets["a"])


def test_a_defaultdict_with_a_lambda_or_set_factory_is_one_graph_and_leaves_with_its_factory():
    counter = CompileCounter()
    compiled = framejit.compile(counts_with_a_lambda, backend=counter)
    x = torch.randn(3)
    out, expected = compiled(x), counts_with_a_lambda(x)
    assert same(out[0], expected[0]) and out[2] == expected[2] == 1
    assert type(out[1]) is collections.defaultdict and same(dict(out[1]), dict(expected[1]))
    assert same(out[1]["new"], [x])  # its factory, rebuilt at the exit, still reads x
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(counts_with_a_lambda)] == ["return"]


def counts_into(x, d):
    for k in ["a", "b", "a"]:
        d[k] += 1
    return x * d["a"]


def appends_into(x, d):
    d["made"].append(x)
    return d["made"][0] * 2


def test_missing_keys_of_a_defaultdict_passed_in_are_made_in_the_trace_and_written_back():
    for factory in (int, lambda: 0):
        counter = CompileCounter()
        compiled = framejit.compile(counts_into, backend=counter)
        mine, theirs = collections.defaultdict(factory, a=1), collections.defaultdict(factory, a=1)
        x = torch.randn(2)
        for _ in range(2):
            assert same(compiled(x, mine), counts_into(x, theirs))
            assert type(mine) is collections.defaultdict and mine.default_factory is factory
            assert dict(mine) == dict(theirs)  # the stores were written back
        assert counter.frame_count == 2  # the second call sees other keys and counts
        framejit.reset()
    lists = collections.defaultdict(list)
    assert same(framejit.compile(appends_into)(x, lists), appends_into(x, collections.defaultdict(list)))
    assert lists["made"] == [x] and lists["made"][0] is x


def counter_reads(x):
    c = collections.Counter(["a", "b", "a", "c", "c", "c"])
    c.update(["b"])
    return x * c["a"] + c["zz"], c.most_common(2), c, "a" in c, sorted(c.items()), c.total()


def counter_missing(x, c):
    return x * c["a"] + c["zz"]


def test_a_counter_made_in_the_trace_or_passed_in_is_one_graph():
    counter = run_both(counter_reads, torch.randn(2))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(counter_reads)] == ["return"]
    assert type(framejit.compile(counter_reads)(torch.randn(2))[2]) is collections.Counter
    counter = CompileCounter()
    compiled = framejit.compile(counter_missing, backend=counter)
    c = collections.Counter(a=3)
    x = torch.randn(2)
    assert same(compiled(x, c), counter_missing(x, c)) and "zz" not in c
    c["zz"] = 4  # now present: the guard on its absence fails
    assert same(compiled(x, c), counter_missing(x, c))
    assert counter.frame_count == 2


def state_by_parameter_and_name(p, d):
    d[p]["seen"] = 1  # keyed by the tensor: an item write replayed at the exit
    d["count"]["n"] = 2  # keyed by a name: would adopt the contents, dropping d[p]
    return p * 2


def test_a_defaultdict_keyed_by_a_tensor_and_a_name_keeps_both_items():
    p = torch.randn(2)
    mine, theirs = collections.defaultdict(dict), collections.defaultdict(dict)
    assert same(framejit.compile(state_by_parameter_and_name)(p, mine), state_by_parameter_and_name(p, theirs))
    assert mine[p] == theirs[p] == {"seen": 1} and mine["count"] == {"n": 2}
    assert list(mine)[0] is p and len(mine) == 2


class _AssertedPatches(torch.nn.Module):
    """timm's PatchEmbed: the input size checked with torch._assert before the projection."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 4, 4, stride=4)

    def forward(self, x):
        torch._assert(x.shape[2] == 8, f"height {x.shape[2]} is not 8")
        torch._assert(x.shape[3] % 4 == 0, "width is not a multiple of 4")
        return self.proj(x).flatten(2).transpose(1, 2)


def test_torch_assert_on_sizes_is_a_guard_in_one_graph():
    model = _AssertedPatches()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    for batch in (2, 3):
        x = torch.randn(batch, 3, 8, 12)
        assert same(compiled(x), model(x))
    assert counter.frame_count == 1 and framejit.explain(model)(x).graph_break_count == 0
    with pytest.raises(AssertionError, match="height 12 is not 8"):
        compiled(torch.randn(2, 3, 12, 12))  # the guard fails; the new trace raises as eager does


class _ConfigForwarding(torch.nn.Module):
    """diffusers' ModelMixin: a __getattr__ of its own that serves old config names and asks
    nn.Module's for the rest (whose AttributeError hasattr / getattr's default turn into False
    / the default)."""

    def __init__(self):
        super().__init__()
        self._internal_dict = {"sample_size": 4}
        self.lin = torch.nn.Linear(3, 3)

    def __getattr__(self, name):
        in_config = "_internal_dict" in self.__dict__ and name in self.__dict__["_internal_dict"]
        if in_config and name not in self.__dict__:
            return self.__dict__["_internal_dict"][name]
        return super().__getattr__(name)


def asks_a_forwarding_getattr(x, model):
    y = model.lin(x) * model.sample_size
    if not hasattr(model, "_diffusers_hook"):
        y = y + 1
    if hasattr(model, "lin") and hasattr(model, "sample_size"):
        y = y * 2
    return y + getattr(model, "missing", 3)


def test_hasattr_and_getattr_default_through_a_classs_own_getattr_are_one_graph():
    model = _ConfigForwarding()
    counter = CompileCounter()
    compiled = framejit.compile(asks_a_forwarding_getattr, backend=counter)
    x = torch.randn(2, 3)
    for _ in range(2):
        assert same(compiled(x, model), asks_a_forwarding_getattr(x, model))
    assert counter.frame_count == 1
    assert framejit.explain(asks_a_forwarding_getattr)(x, model).graph_break_count == 0
    model._diffusers_hook = "hooked"  # now present: the guard on its absence fails
    assert same(compiled(x, model), asks_a_forwarding_getattr(x, model)) and counter.frame_count == 2
    model._internal_dict["missing"] = 10  # __getattr__'s answer changed: its dict read is guarded
    assert same(compiled(x, model), asks_a_forwarding_getattr(x, model)) and counter.frame_count == 3


import inspect  # noqa: E402


class _Processor:
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, scale=1.0):
        return hidden_states


def unused_processor_kwargs(x, processor, kwargs):
    names = set(inspect.signature(processor.__call__).parameters.keys())
    unused = [k for k, _ in kwargs.items() if k not in names]
    defaults = [p.default for p in inspect.signature(processor.__call__).parameters.values()]
    empty = [name for name, p in inspect.signature(processor.__call__).parameters.items()
             if p.default is inspect.Parameter.empty]
    return x * len(names) + len(unused) + defaults[-1], empty


def test_a_signatures_parameters_keys_values_and_items_are_constants_of_one_graph():
    counter = run_both(unused_processor_kwargs, torch.randn(2), _Processor(), {"scale": 2.0, "ip": 1})
    assert counter.frame_count == 1 and [r["exit"] for r in regions(unused_processor_kwargs)] == ["return"]


class _Backend(str, enum.Enum):
    FLASH = "flash"
    NATIVE = "native"


def _native_attention(query, scale=1.0):
    return query * scale


class _Registry:
    """diffusers' _AttentionBackendRegistry: functions and argument names keyed by enum members."""
    _backends = {_Backend.FLASH: lambda query: query, _Backend.NATIVE: _native_attention}
    _arg_names = {_Backend.NATIVE: {"query", "scale"}, _Backend.FLASH: {"query"}}
    _active = _Backend("native")

    @classmethod
    def active(cls):
        return cls._active, cls._backends[cls._active]


_UNSUPPORTED_DEVICES = {torch.float64: frozenset({"mps", "npu"})}


def dispatches_by_enum(x, **kwargs):
    name, fn = _Registry.active()
    kwargs = {k: v for k, v in {"query": x, **kwargs}.items() if k in _Registry._arg_names[name]}
    unsupported = _UNSUPPORTED_DEVICES.get(torch.float64)
    dtype = torch.float32 if unsupported and x.device.type in unsupported else torch.float64
    return fn(**kwargs).to(dtype), name in _Registry._backends, _Registry._backends.get(_Backend.FLASH) is None


def test_a_registry_keyed_by_enum_members_and_a_frozenset_global_are_one_graph():
    counter = CompileCounter()
    compiled = framejit.compile(dispatches_by_enum, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x, scale=2.0, dropout=0.1), dispatches_by_enum(x, scale=2.0, dropout=0.1))
    assert counter.frame_count == 1
    assert framejit.explain(dispatches_by_enum)(x, scale=2.0).graph_break_count == 0
    _Registry._active = _Backend.FLASH  # another member: the identity guard on it fails
    try:
        assert same(compiled(x, scale=2.0), dispatches_by_enum(x, scale=2.0))
        assert counter.frame_count == 2
    finally:
        _Registry._active = _Backend.NATIVE
    _UNSUPPORTED_DEVICES[torch.float64] = frozenset({"cpu"})  # a new frozenset: guarded equal
    try:
        assert same(compiled(x, scale=2.0), dispatches_by_enum(x, scale=2.0))
        assert compiled(x, scale=2.0)[0].dtype == torch.float32
    finally:
        _UNSUPPORTED_DEVICES[torch.float64] = frozenset({"mps", "npu"})


from typing import Dict, List, Optional  # noqa: E402


def collects_with_annotations(x):
    """timm's CrossViT: TorchScript annotations made inside the forward."""
    outs = torch.jit.annotate(List[torch.Tensor], [])
    for i in range(3):
        outs.append(x * i)
    named = torch.jit.annotate(Dict[str, Optional[torch.Tensor]], {"first": outs[0]})
    kinds = (list[int], tuple[int, ...], Optional[int])
    return torch.stack(outs).sum(0) + named["first"], kinds


def test_torch_jit_annotate_and_typing_subscripts_are_one_graph():
    counter = run_both(collects_with_annotations, torch.randn(3))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(collects_with_annotations)] == ["return"]


def _maybe(fn=None):
    """x-transformers' `maybe`: a wrapper made on every call with functools.wraps."""
    if fn is None:
        fn = _identity

    @functools.wraps(fn)
    def inner(x, *args, **kwargs):
        if x is None:
            return x
        return fn(x, *args, **kwargs)
    return inner


def _identity(t):
    """Gives t back."""
    return t


class _MaybeNormed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        scale = x.shape[-1] ** -0.5
        scale = scale if scale is not None else 1.0  # a number is never None
        return _maybe(self.norm)(self.lin(x)) * scale + _maybe()(x), _maybe(None)(None)


def one_graph_for_two_batch_sizes(model):
    """model compiled and called at batch 2 and 3 against eager: one graph, no break."""
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    for batch in (2, 3):
        x = torch.randn(batch, 4)
        assert same(compiled(x), model(x))
    assert counter.frame_count == 1 and framejit.explain(model)(x).graph_break_count == 0
    return compiled, counter, x


def test_functools_wraps_on_a_function_made_in_the_trace_is_one_graph():
    one_graph_for_two_batch_sizes(_MaybeNormed())


def returns_a_wrapper(x):
    return x * 2, _maybe(_identity), _maybe(torch.nn.Identity())


def test_a_wraps_decorated_function_leaving_the_region_has_the_wrapped_metadata():
    x = torch.randn(3)
    out, fn, of_module = framejit.compile(returns_a_wrapper)(x)
    _, eager_fn, eager_of_module = returns_a_wrapper(x)
    assert same(out, x * 2) and fn(x) is x and fn(None) is None
    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        assert getattr(fn, name) == getattr(eager_fn, name), name
    assert fn.__wrapped__ is _identity
    assert type(of_module.__wrapped__) is torch.nn.Identity and of_module.__doc__ == eager_of_module.__doc__
    assert set(of_module.__dict__) == set(eager_of_module.__dict__)  # the module's __dict__ copied in


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = 2
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        first = next(a for a in (self, x) if torch.is_tensor(a))  # (the module is no tensor)
        return self.lin(first) * self.heads * scale


class _AttentionLayers(torch.nn.Module):
    """x-transformers' AttentionLayers: per-layer variables zipped and unpacked, a ModuleList
    holding None, each (norm, block) pair a ModuleList, the block called through a partial."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ModuleList([torch.nn.LayerNorm(4), _Scaled()])
                                           for _ in range(2)])
        self.skips = torch.nn.ModuleList([None, None])
        self.types = ("a", "f")
        self.order = (0, 1)

    def forward(self, x):
        variables = (self.types, self.skips, self.layers)
        variables = tuple(tuple(v[i] for i in self.order) for v in variables)
        for kind, skip, (norm, block) in zip(*variables):
            block = functools.partial(block, scale=0.5)
            x = block(norm(x)) + (1.0 if skip is None else 0.0)
        return x


def test_module_lists_holding_none_and_pairs_unpacked_and_a_partial_of_a_module_are_one_graph():
    model = _AttentionLayers()
    compiled, counter, x = one_graph_for_two_batch_sizes(model)
    model.layers[1][1].heads = 3  # read by source through the partial: guarded
    assert same(compiled(x), model(x)) and counter.frame_count == 2


class _Level(enum.IntEnum):
    OFF = 0
    ON = 1


class _Flags:
    level = _Level.OFF
    name = _Backend.NATIVE


def branches_on_enum_members(x):
    y = x * 2 if _Flags.level else x - 1  # IntEnum 0 is false, as in eager
    return y + 1 if _Flags.name else y


def test_the_truth_of_an_enum_member_read_by_source_is_its_own():
    counter = CompileCounter()
    compiled = framejit.compile(branches_on_enum_members, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x), branches_on_enum_members(x))
    _Flags.level = _Level.ON  # another member: the identity guard fails, the branch flips
    try:
        assert same(compiled(x), branches_on_enum_members(x)) and counter.frame_count == 2
    finally:
        _Flags.level = _Level.OFF


class _OnceLogger:
    """transformers patches logging.Logger with an lru_cache'd `warning_once`: a cached
    function on the class, bound to the logger."""
    def __init__(self):
        self.lines = []


@functools.lru_cache(None)
def _warn_once(self, message):
    self.lines.append(message)


_OnceLogger.warning_once = _warn_once
_ONCE = _OnceLogger()


def warns_once_then_computes(x):
    y = x * 2
    _ONCE.warning_once("caching is off")  # said once, whatever the number of calls
    return y + 1


def test_an_lru_cached_function_on_a_class_called_through_an_instance_is_one_graph():
    global _ONCE
    counter = CompileCounter()
    compiled = framejit.compile(warns_once_then_computes, backend=counter)
    x = torch.randn(3)
    for _ in range(3):
        assert same(compiled(x), warns_once_then_computes(x))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(warns_once_then_computes)] == ["return"]
    assert _ONCE.lines == ["caching is off"]
    other = _OnceLogger()  # another logger at that name: guarded by identity, compiled again
    saved, _ONCE = _ONCE, other
    try:
        assert same(compiled(x), warns_once_then_computes(x)) and counter.frame_count == 2
        assert other.lines == ["caching is off"]
    finally:
        _ONCE = saved


def makes_a_bias_that_requires_grad(x):
    bias = torch.zeros(x.shape[-1])
    bias.requires_grad = True  # T5's position bias under gradient checkpointing
    return x * 2 + bias, bias


def test_requires_grad_set_on_a_tensor_the_graph_makes_is_in_the_graph():
    x = torch.randn(2, 3, requires_grad=True)
    for backend in ("eager", "native"):
        counter = CompileCounter(None if backend == "eager" else backend)
        out, bias = framejit.compile(makes_a_bias_that_requires_grad, backend=counter)(x)
        expected, expected_bias = makes_a_bias_that_requires_grad(x)
        assert same(out, expected) and bias.requires_grad and bias.is_leaf
        out.sum().backward()
        assert same(bias.grad, torch.full((3,), 2.0))
        assert counter.frame_count == 1, backend
        assert [r["exit"] for r in regions(makes_a_bias_that_requires_grad)] == ["return"]
        x.grad = None
        framejit.reset()


class _Stepper:
    def __init__(self):
        self.calls = 0

    def step(self, x):
        self.calls += 1
        return x * 2


def _wrap_step(stepper):
    # torch's LR schedulers wrap the optimizer's step this way (func.__get__(obj, type(obj))).
    func = stepper.step.__func__

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func.__get__(stepper, stepper.__class__)(*args, **kwargs)

    stepper.step = wrapper


def steps_through_a_wrapped_method(x, stepper):
    return stepper.step(x) + 1


def test_a_function_bound_by_its_descriptor_get_is_called_in_the_graph():
    stepper = _Stepper()
    _wrap_step(stepper)
    counter = CompileCounter()
    compiled = framejit.compile(steps_through_a_wrapped_method, backend=counter)
    x = torch.randn(3)
    assert same(compiled(x, stepper), x * 2 + 1) and stepper.calls == 1  # the count, replayed
    assert counter.frame_count == 1
    assert [r["exit"] for r in regions(steps_through_a_wrapped_method)] == ["return"]
