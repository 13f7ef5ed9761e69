"""A recipe read from its file, recipes/NAME.yml, with every message naming the file and the line.

``load_recipe_file`` parses the file with PyYAML's safe loader and keeps the
line of every key, so that a YAML error says where it is and what to do, an
empty file or one that is not a mapping says so, a key given twice is
refused (YAML would keep only the last), and ``locate`` can put the file and
line into the messages of the validation.

PyYAML is imported only when a file is read: the controller has it (the
action plugin of recipe_render runs in the playbook's process); a node may
not, and there the caller passes the loaded recipe instead.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

# What to do about the YAML errors a recipe's author makes most, by words of PyYAML's message.
_YAML_FIXES = (
    ('"\\t"', "YAML indents with spaces only; replace the tab with spaces"),
    ("flow sequence", "close the [ opened there with ], or quote the value if the [ belongs to it"),
    ("flow mapping", "close the { opened there with }, or quote the value if the { belongs to it"),
    ("quoted scalar", "close the quote opened there, or quote the value with the other kind of quote"),
    ("mapping values are not allowed", "quote a value that holds ': ', give each key its own line, or indent the "
                                       "key as the other keys of its mapping"),
    ("could not find expected ':'", "write each field as KEY: VALUE, with a space after the colon"),
    ("expected <block end>", "indent the fields of one mapping by the same number of spaces"),
)
# Errors whose context mark, where the construct opened, is where the author must look.
_AT_CONTEXT = ("flow sequence", "flow mapping", "quoted scalar", "simple key")


def shown_path(path: str) -> str:
    """PATH relative to the working directory when it is under it (recipes/NAME.yml), else as given."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _where(shown: str, line: Optional[int] = None, column: Optional[int] = None) -> str:
    return shown + ("" if line is None else ", line %d" % line) + ("" if column is None else ", column %d" % column)


def key_lines(node: Any, prefix: str, lines: Dict[str, int], twice: List[Tuple[str, int, int]]) -> None:
    """The line of every key under NODE, by dotted path; keys given twice in one mapping go to TWICE."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: Dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            path = "%s.%s" % (prefix, key) if prefix else key
            line = key_node.start_mark.line + 1
            if key in seen and key != "<<":
                twice.append((path, line, seen[key]))
            seen.setdefault(key, line)
            lines.setdefault(path, line)
            key_lines(value_node, path, lines, twice)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = "%s[%d]" % (prefix, i)
            lines.setdefault(path, item.start_mark.line + 1)
            key_lines(item, path, lines, twice)


def _yaml_error(name: str, shown: str, text: str, error: Any) -> str:
    """A PyYAML error as a message: the file, line and column, the problem, the line's text and the fix."""
    context, problem = error.context or "", error.problem or ""
    mark = error.context_mark if error.context_mark and any(w in context for w in _AT_CONTEXT) \
        else error.problem_mark or error.context_mark
    words = " ".join(w for w in (problem, context) if w) or str(error)
    words = re.sub(r"'([^']*)'", r'"\1"', words.replace("'<stream end>'", "the end of the file"))
    fix = next((f for key, f in _YAML_FIXES if key in words), "correct the YAML there")
    where = _where(shown)
    reads = ""
    if mark is not None:
        where = _where(shown, mark.line + 1, mark.column + 1)
        source = text.splitlines()
        if mark.line < len(source) and source[mark.line].strip():
            reads = " (the line reads %s)" % json.dumps(source[mark.line].rstrip())
    return "recipe %s (%s): the file is not valid YAML: %s%s; %s." % (name, where, words, reads, fix)


def load_recipe_file(path: str, name: str) -> Tuple[Any, Dict[str, int], List[str]]:
    """The recipe in PATH, the line of each of its keys (by dotted path), and the problems that stop it.

    The recipe is None when there is a problem.
    """
    shown = shown_path(path)
    try:
        import yaml
    except ImportError:
        return None, {}, ["recipe %s (%s): reading the file needs PyYAML, which this Python lacks; pass the "
                          "loaded recipe as recipe, or run recipe_render from a playbook (its action plugin reads "
                          "the file on the controller)." % (name, shown)]
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None, {}, ["recipe %s (%s): the file does not exist; give the name of a file of the recipes folder, "
                          "without .yml." % (name, shown)]
    except (OSError, UnicodeDecodeError) as exc:
        return None, {}, ["recipe %s (%s): the file cannot be read (%s); make it a UTF-8 text file readable here."
                          % (name, shown, exc)]
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        return None, {}, [_yaml_error(name, shown, text, exc)]
    except yaml.YAMLError as exc:
        return None, {}, ["recipe %s (%s): the file is not valid YAML: %s; correct it." % (name, shown, exc)]
    finally:
        loader.dispose()
    if data is None or node is None:
        return None, {}, ["recipe %s (%s): the file is empty; write the recipe's fields there (recipes/README.md "
                          "lists them; recipes/lab-tp2.yml is a short example)." % (name, shown)]
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else "a single value, %s" % json.dumps(data, default=str)
        return None, {}, ["recipe %s (%s): the file holds %s, not a mapping of fields; write each field at the "
                          "top level as KEY: VALUE, without a leading dash (name: %s, engine: ..., see "
                          "recipes/README.md)." % (name, _where(shown, node.start_mark.line + 1), kind, name)]
    lines: Dict[str, int] = {}
    twice: List[Tuple[str, int, int]] = []
    key_lines(node, "", lines, twice)
    errors = ["recipe %s (%s): %s is given twice in one mapping (first at line %d); YAML keeps only the last, "
              "so keep one." % (name, _where(shown, line), key, first) for key, line, first in twice]
    return (None if errors else data), lines, errors


def _line_of(token: str, lines: Dict[str, int]) -> Optional[int]:
    """The line of the field TOKEN names, or of the nearest field holding it."""
    while token:
        for candidate in (token, token + "_from"):
            if candidate in lines:
                return lines[candidate]
        token = re.sub(r"(\[\d+\]|\.[^.\[]*|^[^.\[]*)$", "", token)
    return None


def locate(errors: List[str], name: str, path: str, lines: Dict[str, int]) -> List[str]:
    """The messages of a recipe read from PATH, each with the file, and the line of the field it names."""
    prefix = "recipe %s: " % name
    shown = shown_path(path)
    out = []
    for message in errors:
        if not message.startswith(prefix):
            out.append(message)
            continue
        rest = message[len(prefix):]
        token = re.match(r"[A-Za-z0-9_.\[\]-]*", rest)
        line = _line_of(token.group(0).rstrip(".") if token else "", lines)
        out.append("recipe %s (%s): %s" % (name, _where(shown, line), rest))
    return out
