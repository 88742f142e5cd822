"""fedlmc.permutation.tracing.axes: the union-find of axes joins equal-sized axes into one class,
poisons both instead when sizes differ, keeps quiet and loud reasons, and lists classes in
creation order."""

from __future__ import annotations

from fedlmc.permutation.tracing.axes import AxisClasses, TensorAxes, _tensors_in


def test_union_joins_classes_transitively_and_lists_them_in_creation_order():
    classes = AxisClasses()
    a, b, c, d = (classes.new(4) for _ in range(4))
    classes.union(a, b)
    classes.union(c, b)
    assert classes.find(a) == classes.find(c) != classes.find(d)
    members = classes.classes()
    assert sorted(members.values()) == [[a, b, c], [d]]


def test_axes_of_different_sizes_are_poisoned_loudly_instead_of_joined():
    classes = AxisClasses()
    a, b = classes.new(3), classes.new(5)
    classes.union(a, b)
    assert classes.find(a) != classes.find(b)
    why = "axes of sizes 3 and 5 met in one operation"
    assert classes.reasons[a] == [(why, True)] and classes.reasons[b] == [(why, True)]


def test_fixed_axes_are_poisoned_quietly_and_a_reason_at_creation_loudly():
    classes = AxisClasses()
    fixed = classes.fixed(2, "model input")
    loud = classes.new(2, reason="unknown op", activation=False)
    assert classes.reasons[fixed] == [("model input", False)]
    assert classes.reasons[loud] == [("unknown op", True)]
    assert classes.activation == [True, False] and classes.size == [2, 2]


def test_tensor_axes_and_nested_leaves():
    axes = TensorAxes((0, 1, 2), (2, 3, 4))
    assert axes.ndim == 3
    assert list(_tensors_in((1, [2, {"a": 3, "b": (4,)}], 5))) == [1, 2, 3, 4, 5]
