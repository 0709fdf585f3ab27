"""Every config key marked as having an effect is read by the code; every key marked as having none is not.

A broker key takes effect through the KafkaConfig attribute (or CleanerConfig field) that
KafkaConfig's source assigns from it; a topic key through its LogConfig attribute. Either must be
read (``.name``) in storage, broker or cli outside the config modules, directly or through a
KafkaConfig/LogConfig method or property that is.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import strom
from strom.broker import config as broker_config
from strom.broker.config import BROKER_CONFIGS, KafkaConfig
from strom.storage import log_config
from strom.storage.log_config import BROKER_SYNONYMS, TOPIC_CONFIGS, LogConfig

PACKAGE = Path(strom.__file__).parent
CONFIG_MODULES = {Path(broker_config.__file__), Path(log_config.__file__)}
REPO = PACKAGE.parent.parent

# KafkaConfig attributes that only feed another attribute inside KafkaConfig.__init__.
DERIVED = {"listener_security_protocol_map": "listeners"}


def _outside_config() -> str:
    """The source of the layers that receive KafkaConfig and LogConfig (not the client's own configs)."""
    files = [p for layer in ("storage", "broker", "cli") for p in sorted((PACKAGE / layer).rglob("*.py"))]
    return "\n".join(p.read_text() for p in files if p not in CONFIG_MODULES)


SOURCE = _outside_config()


def _read_outside(name: str) -> bool:
    return re.search(rf"\.{name}\b", SOURCE) is not None


def _read_via_member(cls: type, attribute: str) -> bool:
    """``attribute`` is read by a method or property of ``cls`` (not __init__) that is read outside."""
    for name, member in vars(cls).items():
        function = member.fget if isinstance(member, property) else member
        if name.startswith("__") or not inspect.isfunction(function):
            continue
        if re.search(rf"self\.{attribute}\b", inspect.getsource(function)) and _read_outside(name):
            return True
    return False


def _broker_attribute_read(attribute: str) -> bool:
    if attribute in DERIVED:
        attribute = DERIVED[attribute]
    return _read_outside(attribute) or _read_via_member(KafkaConfig, attribute)


def _walk(node: ast.AST, parents: tuple[ast.AST, ...] = ()) -> Iterator[tuple[ast.AST, tuple[ast.AST, ...]]]:
    yield node, parents
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, (*parents, node))


def _self_attribute(target: ast.expr) -> str | None:
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr
    return None


def _kafka_config_class() -> ast.ClassDef:
    tree = ast.parse(Path(broker_config.__file__).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KafkaConfig")


def _assigned_from_method(cls: ast.ClassDef, method: str) -> str | None:
    """The attribute __init__ assigns from ``self.<method>(...)``."""
    for node, _ in _walk(cls):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and _self_attribute(value.func) == method
            ):
                return next((a for t in targets if (a := _self_attribute(t))), None)
    return None


def broker_key_readers() -> dict[str, set[str]]:
    """Broker key -> the names KafkaConfig's source turns it into (attributes, CleanerConfig fields)."""
    cls = _kafka_config_class()
    readers: dict[str, set[str]] = {}
    for node, parents in _walk(cls):
        if not (isinstance(node, ast.Constant) and node.value in BROKER_CONFIGS):
            continue
        names: set[str] = set()
        for parent in reversed(parents):
            if isinstance(parent, ast.keyword) and parent.arg:
                names.add(parent.arg)  # a field of a config object built here (CleanerConfig)
                break
            if isinstance(parent, ast.Assign | ast.AnnAssign):
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                names.update(a for t in targets if (a := _self_attribute(t)))
                if names:
                    break
            if isinstance(parent, ast.FunctionDef) and parent.name != "__init__":
                # A helper method: the key takes effect through what __init__ assigns from it.
                if not parent.name.startswith("_"):
                    names.add(parent.name)
                if attribute := _assigned_from_method(cls, parent.name):
                    names.add(attribute)
                break
        if names:
            readers.setdefault(node.value, set()).update(names)
    return readers


READERS = broker_key_readers()
EFFECTIVE_BROKER_KEYS = sorted(k for k, d in BROKER_CONFIGS.items() if d.effect and k not in BROKER_SYNONYMS)
INERT_BROKER_KEYS = sorted(k for k, d in BROKER_CONFIGS.items() if not d.effect and k not in BROKER_SYNONYMS)


@pytest.mark.parametrize("key", EFFECTIVE_BROKER_KEYS)
def test_every_implemented_broker_key_is_read(key: str) -> None:
    readers = READERS.get(key, set())
    assert readers, f"{key} is marked implemented but KafkaConfig never reads it"
    assert any(_broker_attribute_read(name) for name in readers), (
        f"{key} is marked implemented but nothing outside config.py reads {sorted(readers)}"
    )


@pytest.mark.parametrize("key", INERT_BROKER_KEYS)
def test_no_accepted_broker_key_is_read(key: str) -> None:
    assert key not in READERS, f"{key} is read by KafkaConfig but marked 'accepted, no effect'"


@pytest.mark.parametrize("name", sorted(BROKER_SYNONYMS))
def test_broker_defaults_of_topic_configs_share_the_topic_configs_effect(name: str) -> None:
    topic, _ = BROKER_SYNONYMS[name]
    assert BROKER_CONFIGS[name].effect == topic.effect


def _topic_attribute_read(attribute: str) -> bool:
    return _read_outside(attribute) or _read_via_member(LogConfig, attribute)


@pytest.mark.parametrize("name", sorted(TOPIC_CONFIGS))
def test_topic_configs_are_read_exactly_when_marked_as_having_an_effect(name: str) -> None:
    definition = TOPIC_CONFIGS[name]
    read = _topic_attribute_read(definition.attribute)
    where = f"LogConfig.{definition.attribute}"
    if definition.effect:
        assert read, f"topic config {name} is marked as having an effect but nothing reads {where}"
    else:
        assert not read, f"topic config {name} is marked 'no effect' but {where} is read"


def _table_keys(doc: str, heading: str) -> list[str]:
    section = doc.split(heading + "\n", 1)[1]
    rows = re.findall(r"^\| `([^`]+)` \|(.*)$", section.split("\n#", 1)[0], re.MULTILINE)
    return [key for key, _ in rows]


def test_configuration_md_lists_each_key_in_its_group() -> None:
    doc = (REPO / "docs" / "CONFIGURATION.md").read_text()
    assert _table_keys(doc, "### Broker keys Strom implements") == EFFECTIVE_BROKER_KEYS
    assert _table_keys(doc, "### Accepted, no effect") == INERT_BROKER_KEYS
    assert _table_keys(doc, "### Broker defaults of topic configs") == sorted(BROKER_SYNONYMS)
    assert _table_keys(doc, "## Topic configs") == sorted(TOPIC_CONFIGS)
    for name, definition in TOPIC_CONFIGS.items():
        row = re.search(rf"^\| `{re.escape(name)}` \|.*$", doc.split("## Topic configs\n", 1)[1], re.M)
        assert row is not None
        assert ("**No effect" in row.group(0)) == (not definition.effect), name
    for name, (topic, _) in BROKER_SYNONYMS.items():
        section = doc.split("### Broker defaults of topic configs\n", 1)[1].split("\n#", 1)[0]
        row = re.search(rf"^\| `{re.escape(name)}` \|.*$", section, re.M)
        assert row is not None
        assert ("no effect" in row.group(0)) == (not topic.effect), name
