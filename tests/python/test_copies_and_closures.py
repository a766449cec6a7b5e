"""copy.deepcopy, objects whose class has its own __getattribute__ / __setattr__ / __delattr__
made in the trace, recursive nested functions, dicts resized after a finished loop, and class
data (validator registries, type(obj).attr): each against eager, with graph counts and guards.

The shapes are transformers' legacy encoder-decoder configs (T5, BART): DynamicCache asks
config.get_text_config(decoder=True), which deep-copies the config, lists it through to_dict()
(a recursive nested def, a dict trimmed after a loop over it) and renames its decoder_* keys with
delattr / setattr through a strict dataclass's validators."""
import copy

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


class Renaming:
    """A config that renames attributes through its own __getattribute__ / __setattr__."""
    attribute_map = {"hidden_size": "d_model"}
    model_type = "renaming"

    def __init__(self):
        self.d_model = 4
        self.decoder_layers = 2
        self.decoder_ffn = 8
        self.ids = {0: "a", 1: "b"}
        self.shape = (1, [2, 3])

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)


def decoder_view(config):
    view = copy.deepcopy(config)
    for key in view.__dict__.copy():
        if key.startswith("decoder_"):
            value = getattr(view, key)
            delattr(view, key)
            setattr(view, key[len("decoder_"):], value)
    return view


def reads_decoder_view(x, config):
    view = decoder_view(config)
    kept = hasattr(view, "decoder_layers") or getattr(view, "decoder_ffn", None) is not None
    return x * view.layers + view.hidden_size + len(view.ids) + kept, type(view).model_type


def compiled_with(fn):
    counter = CompileCounter()
    return framejit.compile(fn, backend=counter), counter


def test_a_deep_copied_config_renamed_through_its_hooks_is_one_graph_and_leaves_the_original():
    compiled, counter = compiled_with(reads_decoder_view)
    config, x = Renaming(), torch.randn(3)
    before = dict(config.__dict__)
    for _ in range(3):
        assert same(compiled(x, config), reads_decoder_view(x, config))
    assert counter.frame_count == 1 and [r["exit"] for r in regions(reads_decoder_view)] == ["return"]
    assert config.__dict__ == before  # the copy was renamed, not the config
    config.decoder_layers = 5  # the copy reads what the config holds now: compiled again
    assert same(compiled(x, config), reads_decoder_view(x, config))
    assert counter.frame_count == 2
    Renaming.model_type = "changed"  # read through type(view): guarded on the class
    try:
        assert same(compiled(x, config), reads_decoder_view(x, config))
    finally:
        Renaming.model_type = "renaming"


def copies(x, d):
    c = copy.deepcopy(d)
    c["inner"].append(3)
    return x + len(c["inner"]), c


def test_deepcopy_keeps_shared_items_shared_and_copies_every_container():
    shared = [1, 2]
    d = {"inner": shared, "again": shared, "pair": (1, shared), "names": ("a", "b"), "n": None}
    compiled, counter = compiled_with(copies)
    x = torch.randn(2)
    out, c = compiled(x, d)
    ref, c_ref = copies(x, copy.deepcopy(d))
    assert same(out, ref) and c == c_ref and counter.frame_count == 1
    assert c is not d and c["inner"] is not shared and shared == [1, 2]
    assert c["inner"] is c["again"] and c["pair"][1] is c["inner"]  # copy's memo, by identity
    assert c["names"] is d["names"]  # a tuple of atoms is itself, as copy gives it


def copies_an_object_out(x, config):
    view = copy.deepcopy(config)
    view.d_model = 6  # renamed? no: set through the class's own __setattr__
    view.hidden_size = 7  # renamed to d_model by the hook
    return x * view.d_model, view


def test_a_copied_object_leaving_the_region_is_rebuilt_with_its_class_and_state():
    compiled, counter = compiled_with(copies_an_object_out)
    config, x = Renaming(), torch.randn(2)
    out, view = compiled(x, config)
    ref, ref_view = copies_an_object_out(x, config)
    assert same(out, ref) and type(view) is Renaming and view.__dict__ == ref_view.__dict__
    assert view.ids is not config.ids and view.hidden_size == 7 and config.d_model == 4
    assert counter.frame_count == 1


def copies_a_tensor(x, memo_given):
    state = {"w": x, "n": 2}
    c = copy.deepcopy(state, {}) if memo_given else copy.deepcopy(state)
    return c["w"] * c["n"], c["w"] is x


@pytest.mark.parametrize("memo_given", [False, True])
def test_deepcopy_of_what_its_form_does_not_copy_is_left_to_python(memo_given):
    x = torch.randn(3)
    out, shared = framejit.compile(copies_a_tensor)(x, memo_given)
    assert same(out, x * 2) and shared is False  # a real copy of the tensor


def deletes(x):
    obj = Renaming()
    del obj.decoder_layers
    delattr(obj, "decoder_ffn")
    return x * obj.d_model + hasattr(obj, "decoder_layers") + getattr(obj, "decoder_ffn", 10), obj


def test_del_and_delattr_of_an_attribute_of_an_object_the_trace_made_are_one_graph():
    compiled, counter = compiled_with(deletes)
    x = torch.randn(2)
    out, obj = compiled(x)
    ref, ref_obj = deletes(x)
    assert same(out, ref) and obj.__dict__.keys() == ref_obj.__dict__.keys()
    assert counter.frame_count == 1


class Guarded:
    def __init__(self):
        self.a = 1

    def __delattr__(self, name):
        if name == "a":
            raise AttributeError("a is required")
        super().__delattr__(name)


def deletes_through_a_hook(x, name):
    obj = Guarded()
    obj.b = 2
    delattr(obj, name)
    return x + len(obj.__dict__)


def test_a_classs_own_delattr_runs_in_the_trace_and_its_error_is_raised():
    x = torch.randn(2)
    assert same(framejit.compile(deletes_through_a_hook)(x, "b"), deletes_through_a_hook(x, "b"))
    with pytest.raises(AttributeError, match="a is required"):
        framejit.compile(deletes_through_a_hook)(x, "a")


def flattens(x, nested):
    def flat(v):  # refers to itself through its closure cell
        if isinstance(v, tuple):
            return [flat(i) for i in v]
        return v
    return x * len(flat(nested)), flat(nested)


def returns_a_recursive_function(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return torch.relu(x * fact(4)), fact


def keeps_it_across_a_break(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    y = x * fact(3)
    if y.sum() > 0:
        return fact(5) * y
    return fact(2) * y


def test_a_recursive_nested_function_is_traced_and_rebuilt_where_it_outlives_the_region():
    x = torch.randn(3)
    compiled, counter = compiled_with(flattens)
    assert same(compiled(x, (1, (2, 3))), flattens(x, (1, (2, 3)))) and counter.frame_count == 1
    out, fact = framejit.compile(returns_a_recursive_function)(x)
    assert same(out, returns_a_recursive_function(x)[0])
    assert fact(5) == 120 and fact.__closure__[0].cell_contents is fact  # its own cell again
    for arg in (x.abs() + 1, -x.abs() - 1):
        assert same(framejit.compile(keeps_it_across_a_break)(arg), keeps_it_across_a_break(arg))


def trims_after_a_loop(x):
    d = {"a": 1, "_private": 2, "b": 3}
    total = 0
    for key, value in d.items():
        total += value
    d.pop("_private")
    d["c"] = 4
    return x * total + len(d), d


def resizes_inside_a_loop(x):
    d = {"a": 1, "b": 2}
    for key in d:
        d[key + "!"] = 0
    return x


def test_a_dict_resized_after_its_loop_finished_is_one_graph_but_not_inside_the_loop():
    compiled, counter = compiled_with(trims_after_a_loop)
    x = torch.randn(2)
    assert same(compiled(x), trims_after_a_loop(x)) and counter.frame_count == 1
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        framejit.compile(resizes_inside_a_loop)(x)


class Spec:
    __slots__ = ("name", "kind")

    def __init__(self, name, kind):
        self.name, self.kind = name, kind


def type_validator(spec):
    def validator(value):
        if not isinstance(value, spec.kind):
            raise TypeError(f"{spec.name} must be {spec.kind.__name__}")
    return validator


class Strict:
    """A strict dataclass's shape (huggingface_hub.dataclasses.strict): validators per field in
    a class registry, each a closure over its field's spec, run by __setattr__."""
    __validators__ = {"n": [type_validator(Spec("n", int))]}

    def __init__(self, n):
        self.n = n

    def __setattr__(self, name, value):
        for check in self.__validators__.get(name, []):
            try:
                check(value)
            except (TypeError, ValueError) as e:
                raise ValueError(f"invalid {name}") from e
        object.__setattr__(self, name, value)


def validates(x, n):
    s = Strict(3)
    s.n = n
    return x * s.n


def test_validators_held_as_class_data_run_in_the_trace():
    compiled, counter = compiled_with(validates)
    x = torch.randn(2)
    assert same(compiled(x, 4), validates(x, 4)) and counter.frame_count == 1
    with pytest.raises(ValueError, match="invalid n"):
        compiled(x, 2.5)


class Scaled:
    scale = 2.0


def reads_the_class(x, obj):
    return x * type(obj).scale


def test_a_class_attribute_read_through_type_is_guarded():
    compiled, counter = compiled_with(reads_the_class)
    x, obj = torch.randn(2), Scaled()
    assert same(compiled(x, obj), reads_the_class(x, obj)) and counter.frame_count == 1
    Scaled.scale = 3.0
    try:
        assert same(compiled(x, obj), x * 3.0)  # not the 2.0 the first trace read
    finally:
        Scaled.scale = 2.0


def compares(x, d, t):
    return x + (d is t) + (t is d["t"]) + (d is not [1])


def test_is_between_a_dict_a_tuple_and_a_new_list_is_decided_and_guarded():
    t = (1, 2)
    d = {"t": t}
    compiled, counter = compiled_with(compares)
    x = torch.randn(2)
    assert same(compiled(x, d, t), compares(x, d, t)) and counter.frame_count == 1
    other = {"t": tuple([1, 2])}  # an equal tuple that is another object: the guard sees it
    assert same(compiled(x, other, t), compares(x, other, t)) and counter.frame_count == 2


class Bag:
    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)


class Flag:
    def __init__(self, on):
        self.on = on

    def __bool__(self):
        return self.on


def branches_on_truth(x, bag):
    if Bag([]):
        x = x + 100
    if bag:
        x = x * 2
    if Flag(False) or not Bag([1]):
        x = x - 1
    return x, bool(Flag(True)), not bag


def test_the_truth_of_an_object_is_its_classs_bool_or_len_run_in_the_trace():
    compiled, counter = compiled_with(branches_on_truth)
    x = torch.randn(2)
    for bag in (Bag([1, 2]), Bag([3]), Bag([])):
        assert same(compiled(x, bag), branches_on_truth(x, bag))
    # __len__ reads bag.items, a list loaded whole: its length and its numbers are guarded (eager
    # specialisation, where Dynamo would guard the length alone), so each bag compiles apart; the
    # empty bag's region records no tensor op, hence no graph.
    assert counter.frame_count == 2
    assert [r["exit"] for r in regions(branches_on_truth)] == ["return"] * 3
    assert same(compiled(x, Bag([1, 2])), branches_on_truth(x, Bag([1, 2])))
    assert len(regions(branches_on_truth)) == 3  # another bag of the same items reuses its region
