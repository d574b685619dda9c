"""The connection objects keep their attributes in slots (workers/connection_slots.py):
an attribute a method assigns that is not in its class's list raises
AttributeError only when that path runs, so every list is checked here
against what the class's code assigns, and the objects against a dict."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from shoal.workers.connection import Connection
from shoal.workers.mqtt_connection import MqttConnection


def assigned(cls: type) -> set[str]:
    """The names `self.<name> = ...` stores in the class's own code."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


@pytest.mark.parametrize("cls", [Connection, MqttConnection])
def test_every_attribute_the_class_assigns_has_its_slot(cls: type) -> None:
    properties = {name for name, v in vars(cls).items() if isinstance(v, property)}
    assert sorted(assigned(cls) - properties - set(cls.__slots__)) == []
    assert sorted(set(cls.__slots__) - assigned(cls)) == []  # none left behind


@pytest.mark.parametrize("cls", [Connection, MqttConnection])
def test_instances_have_no_dict(cls: type) -> None:
    assert cls.__dictoffset__ == 0  # every base has __slots__ too
    obj = cls.__new__(cls)
    with pytest.raises(AttributeError):
        obj.not_an_attribute = 1  # type: ignore[attr-defined]
