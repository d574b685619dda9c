"""The C paths' attribute reads and writes (workers/_attrs.h attr_get and
attr_set, through _wire.slot_get / slot_set): a plain __slots__ entry is read
and written in its place, learnt once per (type, name); everything else, and
every change to a class after that, must behave as Python's own getattr and
setattr do."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from shoal.workers._wire import slot_get, slot_set


class Slotted:
    __slots__ = ("__weakref__", "a", "b")

    def __init__(self) -> None:
        self.a = 1
        self.b = "two"


class Derived(Slotted):
    __slots__ = ("c",)


class WithDict:
    def __init__(self) -> None:
        self.a = 10


class Hooked:
    __slots__ = ("a",)

    def __getattr__(self, name: str) -> str:
        return "hooked " + name


class Guarded:
    __slots__ = ("a",)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, ("guarded", value))


def test_slots_read_and_written_in_place() -> None:
    obj = Slotted()
    for _ in range(3):  # the first call learns, the others hit
        assert slot_get(obj, "a") == 1
        assert slot_get(obj, "b") == "two"
    slot_set(obj, "a", 5)
    assert obj.a == 5 and slot_get(obj, "a") == 5
    derived = Derived()
    derived.c = 7
    assert (slot_get(derived, "a"), slot_get(derived, "c")) == (1, 7)
    slot_set(derived, "c", 8)
    assert derived.c == 8


def test_an_empty_slot_and_a_missing_name_raise_as_getattr() -> None:
    obj = Slotted()
    del obj.a
    for _ in range(2):
        with pytest.raises(AttributeError):
            slot_get(obj, "a")
        with pytest.raises(AttributeError):
            slot_get(obj, "nothing")
    slot_set(obj, "a", 3)  # (an empty slot is written as any other)
    assert obj.a == 3
    with pytest.raises(AttributeError):
        slot_set(obj, "nothing", 1)  # (no __dict__)


def test_a_class_changed_after_it_was_learnt() -> None:
    class Changing:
        __slots__ = ("a",)

    obj = Changing()
    obj.a = 1
    assert slot_get(obj, "a") == 1
    slot_set(obj, "a", 2)
    saved = Changing.a  # type: ignore[attr-defined]
    Changing.a = property(lambda self: "property")  # type: ignore[attr-defined,assignment]
    assert slot_get(obj, "a") == "property"
    with pytest.raises(AttributeError):
        slot_set(obj, "a", 3)  # (a property without a setter)
    Changing.a = saved  # type: ignore[attr-defined]
    assert slot_get(obj, "a") == 2


def test_a_subclass_that_hides_a_slot_with_a_property() -> None:
    class Hiding(Slotted):
        __slots__ = ()

        @property  # type: ignore[override]
        def a(self) -> str:
            return "hidden"

    base, hiding = Slotted(), Hiding.__new__(Hiding)  # (Slotted.__init__ sets a)
    assert slot_get(base, "a") == 1
    assert slot_get(hiding, "a") == "hidden"
    assert slot_get(base, "a") == 1


def test_what_is_not_a_plain_slot_takes_python_s_path() -> None:
    plain = WithDict()
    assert slot_get(plain, "a") == 10
    slot_set(plain, "a", 11)
    assert plain.a == 11
    slot_set(plain, "new", 1)
    assert plain.new == 1  # type: ignore[attr-defined]
    hooked = Hooked()
    assert slot_get(hooked, "a") == "hooked a"  # (empty slot: __getattr__)
    hooked.a = 1
    assert slot_get(hooked, "a") == 1
    guarded = Guarded()
    slot_set(guarded, "a", 1)
    assert guarded.a == ("guarded", 1)


def test_another_class_s_slot_on_a_class_is_refused_as_python_does() -> None:
    class Other:
        __slots__ = ("a",)

    class Borrowing:
        __slots__ = ("x", "y")

    Borrowing.stolen = Other.a  # type: ignore[attr-defined]
    obj = Borrowing()
    obj.x = obj.y = "not a"  # (Other.a's place in an Other: one of these in a Borrowing)
    for _ in range(2):
        with pytest.raises(TypeError):
            _ = obj.stolen
        with pytest.raises(TypeError):
            slot_get(obj, "stolen")


def test_many_types_and_names_share_the_cache_without_mixing() -> None:
    # More (type, name) pairs than the cache has places: collisions evict,
    # never answer for another pair.
    classes = [
        type(f"C{i}", (), {"__slots__": tuple(f"n{j}" for j in range(12))}) for i in range(40)
    ]
    objs = []
    for i, cls in enumerate(classes):
        obj = cls()
        for j in range(12):
            setattr(obj, f"n{j}", (i, j))
        objs.append(obj)
    for _ in range(3):
        for i, obj in enumerate(objs):
            for j in range(12):
                assert slot_get(obj, f"n{j}") == (i, j)
                slot_set(obj, f"n{j}", (i, j))


def test_a_written_slot_lets_its_old_value_go() -> None:
    class Value:
        pass

    obj = Slotted()
    old = Value()
    slot_set(obj, "b", old)
    gone = weakref.ref(old)
    del old
    slot_set(obj, "b", "new")
    gc.collect()
    assert gone() is None
    assert slot_get(obj, "b") == "new"
