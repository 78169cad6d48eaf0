"""Loading a run configuration: presets, YAML files and ``--set key.sub=value`` overrides (and the options of a
``run``-style command) into a ``fedseg.config.RunConfig``; ``ConfigError`` and messages that name the bad key
(``validation_problems``, a bad value worded plainly), ``error_text``, ``dump_config``, and a recorded
configuration read with the defaults its run used (``with_recorded_defaults``)."""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from fedseg.config import CHANGED_METHOD_DEFAULTS, RunConfig


def with_recorded_data_seed(recorded: dict) -> dict:
    """A configuration recorded by a fedseg before ``data.seed`` existed (its ``data`` has no ``seed``), with the
    ``data.seed`` its run really used: the run seed, which then generated the built-in federation, dealt the
    repartition and drew the split. A copy; a newer configuration is returned as it is. So a resume (or a bench
    finding its finished runs) of an old run of seed 0 matches the default ``data.seed: 0``, and one of another
    seed differs in ``data.seed`` and is refused, rather than training on other images than its checkpoint's."""
    data = recorded.get("data")
    if not isinstance(data, dict) or "seed" in data:
        return recorded
    return {**recorded, "data": {**data, "seed": recorded.get("seed", 0)}}


def with_recorded_method_defaults(recorded: dict) -> dict:
    """A configuration recorded before an option of ``CHANGED_METHOD_DEFAULTS`` existed, with the value its run
    used (e.g. ``methods.fedper.private_unit: blocks``) for each such method it names (in ``algorithms`` or
    ``methods``). A copy; a configuration that needs nothing is returned as it is."""
    algorithms = recorded.get("algorithms")
    methods = recorded.get("methods") or {}
    if not isinstance(methods, dict):
        return recorded
    named = set(methods) | (set(algorithms) if isinstance(algorithms, list) else set())
    added = {}
    for name, defaults in CHANGED_METHOD_DEFAULTS.items():
        entry = methods.get(name) or {}
        if name in named and isinstance(entry, dict) and any(k not in entry for k in defaults):
            added[name] = {**{k: old for k, (old, _) in defaults.items()}, **entry}
    return {**recorded, "methods": {**methods, **added}} if added else recorded


RECORDED_SCORING = {"score_on": "channels", "score_grid": "model"}  # what runs scored before the options existed
ON_OWN_GRID = ("synthetic-retina", "synthetic-prostate")  # generated at data.image_size: both grids score the same


def recorded_score_grid(recorded: dict) -> str:
    """Where a run recorded before ``eval.score_grid`` scored, as the new option names it: ``original`` on the volume
    path (each case's own grid, always) and for the 2D built-in federations (generated at ``data.image_size``: the
    model grid is each case's own), else ``model`` (a folder federation's images were scored resized)."""
    data = recorded.get("data")
    data = data if isinstance(data, dict) else {}
    volume = data.get("volume")
    volume = volume if isinstance(volume, dict) else {}
    if volume.get("patch_size") is not None:
        return "original"
    own = data.get("source", "synthetic-retina") in ON_OWN_GRID and not data.get("root")
    return "original" if own else RECORDED_SCORING["score_grid"]


def with_recorded_scoring(recorded: dict) -> dict:
    """A configuration recorded before ``eval.score_on`` or ``eval.score_grid`` existed (its ``eval`` without the
    key), with the scoring its run used (``channels``; :func:`recorded_score_grid`). A copy; a newer configuration is
    returned as it is. So a resume or a bench of an old run keeps scoring as its first rounds did (a new default that
    would change its numbers is refused as a change), and one whose numbers it would not change still matches."""
    ev = recorded.get("eval")
    if not isinstance(ev, dict) or all(key in ev for key in RECORDED_SCORING):
        return recorded
    was = {"score_on": RECORDED_SCORING["score_on"], "score_grid": recorded_score_grid(recorded)}
    return {**recorded, "eval": {**{k: v for k, v in was.items() if k not in ev}, **ev}}


def with_recorded_defaults(recorded: dict) -> dict:
    """A recorded configuration with every key an older fedseg did not write at the value its run used:
    ``with_recorded_data_seed``, ``with_recorded_method_defaults`` and ``with_recorded_scoring``; what resumes and
    the bench compare."""
    return with_recorded_scoring(with_recorded_method_defaults(with_recorded_data_seed(recorded)))


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


def error_text(error: BaseException) -> str:
    """The one line a CLI prints for a known error: its message as written. ``str(KeyError("x"))`` quotes it
    (``'x'``), so a KeyError gives its argument; stripping quotes from both ends instead cut the closing quote
    of messages like ``must be 'adam' or 'sgd', got 'adamw'``. An OSError with a file names it: ``PATH: No space left
    on device``."""
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])
    if isinstance(error, OSError) and error.filename is not None:  # a full disk, a read-only or forbidden folder
        return f"{error.filename}: {error.strerror or error}"
    return str(error)


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("fedseg.presets").iterdir() if p.name.endswith(".yaml"))


def preset_description(name: str) -> str:
    return str(read_yaml_mapping(_preset_text(name), f"preset {name}").get("description", ""))


def preset_yaml(name: str) -> str:
    """Preset ``name`` as a config file to start from: its YAML as shipped, the ``description`` key turned
    into a leading comment (``fedseg presets show NAME > my.yaml``; ``--config my.yaml`` loads the same config)."""
    text = _preset_text(name)
    description = preset_description(name)
    lines, skipping = [], False
    for line in text.splitlines():
        if line.startswith("description:"):
            skipping = True
            continue
        if skipping and (line[:1] in (" ", "\t") or not line.strip()):
            continue  # a multi-line description value
        skipping = False
        lines.append(line)
    header = [f"# {d}".rstrip() for d in description.splitlines()] if description else []
    return "\n".join([f"# fedseg preset {name}", *header, *lines]) + "\n"


def _preset_text(name: str) -> str:
    path = resources.files("fedseg.presets") / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(preset_names())}")
    return path.read_text()


def read_yaml_mapping(text: str, where: str, empty: str | None = None) -> dict:
    """``text`` parsed as a YAML mapping; a ConfigError naming ``where`` for bad YAML, a key given twice in one
    mapping (YAML would keep the last silently) or another top level, and (``empty``: the rest of that message) for
    text of blanks and comments only."""
    try:
        loader = yaml.SafeLoader(text)  # yaml.safe_load's steps, with a look at the nodes between them
    except yaml.YAMLError as e:  # the reader refuses a control character (a NUL byte) before any parsing
        raise ConfigError(f"{where}: not valid YAML: {yaml_problem(e)}") from None
    try:
        root = loader.get_single_node()
        twice = _key_given_twice(root)
        loaded = None if root is None else loader.construct_document(root)
    except yaml.YAMLError as e:
        context, mark = getattr(e, "context", None), getattr(e, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(
            f"{where}: not valid YAML: {context + ', ' if context else ''}{yaml_problem(e)}{line}"
        ) from None
    finally:
        loader.dispose()
    if twice:
        raise ConfigError(f"{where}: {twice}")
    if loaded is None and empty is not None:
        raise ConfigError(f"{where}: {empty}")
    data = loaded or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    return data


def _key_given_twice(root: yaml.Node | None) -> str | None:
    """``key 'a.b' given twice (lines 3 and 9); keep one`` for a key that appears twice in one mapping of the
    composed YAML ``root`` (but a merge key ``<<``, whose keys the mapping may override), or None."""
    stack: list[tuple[yaml.Node, str]] = [] if root is None else [(root, "")]
    walked: set[int] = set()  # an alias is the node it names: walked once
    while stack:
        node, path = stack.pop()
        if id(node) in walked:
            continue
        walked.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack += [(item, f"{path}{i}.") for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                line = key.start_mark.line + 1
                if (key.tag, key.value) in lines:
                    first = lines[(key.tag, key.value)]
                    at = f"line {line}" if first == line else f"lines {first} and {line}"
                    return f"key {path + key.value!r} given twice ({at}); keep one"
                lines[(key.tag, key.value)] = line
                stack.append((value, f"{path}{key.value}."))
    return None


def apply_override(
    data: dict, assignment: str, option: str = "--set", where: str | None = None, read: dict | None = None
) -> None:
    """Apply ``key.sub=value`` to a nested dict in place; the value is parsed as YAML. ``option``: the command-line
    option the assignment came from, for the error message; ``where``: the config ``data`` was read from (``read``:
    as read, before any override), blamed when it holds something else than a section where the key needs one
    (``data: [1, 2]``)."""
    if "=" not in assignment:
        raise ConfigError(f"{option} {assignment!r}: expected key.sub=value")
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            section = ".".join(parts[: i + 1])
            if where is not None and _holds(read, parts[: i + 1], node):  # the config's own value, not the option's
                raise ConfigError(f"{where}: {section}: expected a section (key: value lines), got {node!r}")
            raise ConfigError(f"{option} {key}: {part!r} is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"{option} {key.strip()}: {raw!r} is not a valid YAML value ({yaml_problem(e)})") from None


def _holds(data: object, path: Sequence[str], value: object) -> bool:
    """Whether the nested dict ``data`` holds ``value`` at ``path``."""
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return data == value


def yaml_problem(error: yaml.YAMLError) -> str:
    """What the YAML parser found wrong, in one line (e.g. "expected ',' or ']', but got '<stream end>'")."""
    problem = getattr(error, "problem", None)
    return str(problem or error).splitlines()[0]


def load_config(
    preset: str | None = None,
    file: str | Path | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | str = (),
    labels: Mapping[str, str] | None = None,
) -> RunConfig:
    """Build a RunConfig from a preset name or a YAML file, then apply overrides (``key.sub=value``) in order.
    ``overrides``: a list of ``key.sub=value`` strings (each value parsed as YAML, as ``--set`` parses it), one such
    string, or a mapping ``{"fl.rounds": 3, "algorithms": ["local", "fedavg"]}`` (each value written as YAML, then
    read as ``--set`` reads it); a TypeError for anything else. ``labels``: the option that wrote an override's key
    (``{"fl.rounds": "--rounds"}``), for the error message; an override without one is a ``--set``."""
    assignments = override_list(overrides)
    if (preset is None) == (file is None):
        raise ConfigError("give exactly one of --preset NAME or --config FILE")
    if preset is not None:
        data, where = read_yaml_mapping(_preset_text(preset), f"preset {preset}"), f"preset {preset}"
    else:
        assert file is not None  # exactly one of preset/file was given (checked above)
        path = Path(file)
        text = read_config_text(path, "config")
        empty = f"the config file is empty (start from `fedseg presets show demo > {shlex.quote(path.name)}`)"
        data, where = read_yaml_mapping(text, str(path), empty), str(path)
    data.pop("description", None)
    read = copy.deepcopy(data)  # as the preset or file gave it: blamed for a value that is no section
    for assignment in assignments:
        key = assignment.split("=", 1)[0].strip()
        apply_override(data, assignment, (labels or {}).get(key, "--set"), where, read)
    keys = [a.split("=", 1)[0].strip() for a in assignments]
    return validate_config(data, where, {key: (labels or {}).get(key, "--set") for key in keys})


def override_list(overrides: object) -> list[str]:
    """``load_config``'s ``overrides`` as ``key.sub=value`` strings: a string is one override, a mapping's values are
    written as YAML (``{"fl.rounds": 3}`` -> ``fl.rounds=3``; tuples as lists, paths as strings), a list or tuple of
    strings is kept; a TypeError saying what is expected otherwise (not a bare character-by-character reading)."""
    expected = "expected 'key.sub=value', a list of them or a mapping {'key.sub': value}"
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        listed = []
        for key, value in overrides.items():
            if not isinstance(key, str) or "=" in key:
                raise TypeError(f"overrides: key {key!r} is not a config key (key.sub); {expected}")
            value = json.loads(json.dumps(value, default=str))  # as YAML would hold it: tuples as lists, paths as str
            text = yaml.safe_dump(value, default_flow_style=True, width=2**31 - 1, allow_unicode=True)
            listed.append(f"{key}={text.strip().removesuffix('...').strip()}")  # a scalar's document end: dropped
        return listed
    if isinstance(overrides, (bytes, bytearray)) or not isinstance(overrides, Iterable):
        raise TypeError(f"overrides: got {type(overrides).__name__}; {expected}")
    listed = list(overrides)
    for item in listed:
        if not isinstance(item, str):
            raise TypeError(f"overrides: item {item!r} ({type(item).__name__}) is not a string; {expected}")
    return listed


def read_config_text(path: Path, what: str) -> str:
    """The text of the YAML ``what`` file (``config``, ``bench``) at ``path``; a ConfigError naming it where it is
    missing, a folder, or not UTF-8 text (a binary file)."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a {what} file (YAML)")
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"{path}: is a link that leads nowhere (a loop or a missing target), not a {what} file")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path}: is not a regular file (a device or a pipe), not a {what} file (YAML)")
    if not path.is_file():
        raise ConfigError(f"{path}: {what} file not found")
    from fedseg.atomic_files import read_text

    try:
        return read_text(path)
    except ValueError as e:  # not UTF-8: the message names the file and the byte
        raise ConfigError(f"{e}; save the {what} file as UTF-8") from None


def validate_config(data: dict, where: str, overridden: Mapping[str, str] | None = None) -> RunConfig:
    """``data`` as a RunConfig; a ConfigError naming ``where`` and every bad key otherwise (a key an override wrote,
    ``overridden``: key -> the option that wrote it, is named by that option instead)."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_problems(e, model=RunConfig, where=where, overridden=overridden)) from None


def validation_problems(
    error: ValidationError,
    prefix: str = "",
    model: type[BaseModel] | None = None,
    where: str = "",
    overridden: Mapping[str, str] | None = None,
) -> str:
    """Every problem of a pydantic ``error`` as ``key.sub: message``, joined by ``; `` (``prefix``: before each key).

    An unknown key says so, with the closest known key of ``model`` (the validated model) where one is close; a
    problem of a key an override wrote (``overridden``: key -> the option, ``--set``, ``--rounds``...), or of a key
    inside it, or an unknown section an override created, is named by that option (``--set fl.round``); ``where``
    (a preset or file) opens the line unless every problem came from an option. A bad value says what it must be
    and what it got (``--set train.lr must be a number, got 'abc'``, :func:`plain_problem`), and a list's item is
    named by its index in brackets (``tune.folds[0]``)."""
    problems, from_option, overridden = [], [], overridden or {}
    for err, said in _union_branches_merged(error.errors()):
        key = prefix + _bracketed(err["loc"]) if err["loc"] else prefix.removesuffix(".")  # a section's own check
        message = err["msg"].removeprefix("Value error, ")
        unknown = err["type"] == "extra_forbidden"
        if unknown:
            message = "unknown key" + _known_keys_hint(model, err["loc"])
        # a check across sections (no key), or a section's check whose message opens with the full key it is about
        # (``model.strides needs ...``): named by the option of a key it opens with or names in its text
        if not key or message.startswith(key + "."):
            opens = next((o for o in overridden if message.startswith((o + "=", o + ":", o + "."))), None)
            named = opens or next((o for o in overridden if re.search(rf"\b{re.escape(o)}\b", message)), None)
            from_option.append(named is not None)
            if opens is not None:
                problems.append(_named(opens, overridden[opens]) + message[len(opens) :])
            else:
                problems.append(message if named is None else f"{_named(named, overridden[named])}: {message}")
            continue
        option = next(
            (
                label
                for o, label in overridden.items()
                if key == o or key.startswith((o + ".", o + "[")) or (unknown and o.startswith(key + "."))
            ),
            None,
        )
        from_option.append(option is not None)
        said = None if unknown else said or plain_problem(err)
        problems.append(f"{_named(key, option)} {said}" if said else f"{_named(key, option)}: {message}")
    text = "; ".join(problems)
    return text if not where or all(from_option) else f"{where}: {text}"


PLAIN_TYPES = {  # pydantic's error type -> what the value must be
    **dict.fromkeys(("float_parsing", "float_type"), "must be a number"),
    **dict.fromkeys(("int_parsing", "int_type", "int_from_float"), "must be an integer"),
    "finite_number": "must be a finite number",
    **dict.fromkeys(("bool_parsing", "bool_type"), "must be true or false"),
    "string_type": "must be text",
    **dict.fromkeys(("list_type", "tuple_type", "set_type", "frozen_set_type"), "must be a list"),
    **dict.fromkeys(("dict_type", "model_type", "model_attributes_type"), "must be a mapping (key: value lines)"),
    **dict.fromkeys(("literal_error", "enum"), "must be {expected}"),
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be greater than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} item(s)",
}


def plain_problem(err: Mapping[str, Any]) -> str | None:
    """A pydantic error (one of ``ValidationError.errors()``) as what its value must be and what it got (``must be a
    number, got 'abc'``; ``must be at least 1, got -1``; ``must be 'adam' or 'sgd', got 'adamw'``); ``is missing``
    for a required key not given; None for an error of another type (its own message says it)."""
    if err["type"] == "missing":
        return "is missing"
    wanted = PLAIN_TYPES.get(err["type"])
    if wanted is None:
        return None
    try:
        wanted = wanted.format(**{k: _shown(v, quoted=False) for k, v in (err.get("ctx") or {}).items()})
    except (KeyError, IndexError):  # a context pydantic words otherwise: its message says it
        return None
    return f"{wanted}, got {_shown(err.get('input'))}"


def _shown(value: object, quoted: bool = True) -> str:
    """A value as the error names it: text quoted (``'abc'``, unless not ``quoted``: a bound or a choice pydantic
    quoted already), nothing given as ``nothing``, anything else as YAML writes it (``true``, ``.inf``, ``[1, a]``)."""
    if isinstance(value, str):
        text = repr(value) if quoted else value
    elif value is None:
        text = "nothing"
    else:
        try:
            dumped = yaml.safe_dump(list(value) if isinstance(value, tuple) else value, default_flow_style=True)
            text = re.sub(r"\s*\n\s*", " ", dumped.strip().removesuffix("...").strip())  # YAML wraps long ones
        except yaml.YAMLError:  # an object YAML cannot write
            text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


SHOWN_CHARS = 80  # a longer value (a whole section given where a number belongs) is cut: the line stays one line


_TYPE_TAGS = frozenset({"int", "float", "str", "bool", "none", "bytes"})  # a bare scalar type; others carry [...]


def _is_type_tag(part: object) -> bool:
    """Whether a part of a pydantic error's ``loc`` names the branch of a union it was checked against (``int``,
    ``tuple[int, ...]``, ``literal['MR','CT']``), not a key: no configuration key is a type name or holds brackets."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part)


def _union_branches_merged(errors: Sequence[Any]) -> list[tuple[dict, str | None]]:
    """Pydantic's errors with the union branch tags dropped from their ``loc``, each with its plain text where it
    is merged (else None: :func:`plain_problem` says it). A value one union field refused gets an error per branch
    (``patch_size.int``, ``patch_size.tuple[int, ...]``): where a branch failed inside the value (an item of a list,
    ``spacing[1]``), only that deepest error is kept, it says what is wrong; where every branch refused the value
    itself, one line says every kind it may be (``must be an integer or a list, got 'abc'``)."""
    groups: dict[tuple, list[tuple[dict, int]]] = {}
    order: list[tuple] = []
    for err in errors:
        loc = list(err["loc"])
        tag = next((i for i, part in enumerate(loc) if _is_type_tag(part)), None)
        field = tuple(loc if tag is None else loc[:tag]) + (() if tag is None else ("|",))
        cleaned = {**err, "loc": tuple(part for part in loc if not _is_type_tag(part))}
        if field not in groups:
            order.append(field)
        groups.setdefault(field, []).append((cleaned, len(loc) - (len(loc) if tag is None else tag + 1)))
    out: list[tuple[dict, str | None]] = []
    for field in order:
        group = groups[field]
        if field[-1:] != ("|",):
            out += [(err, None) for err, _ in group]
            continue
        depth = max(d for _, d in group)
        deepest = [err for err, d in group if d == depth]
        said = [plain_problem(err) or "" for err in deepest]
        if depth or len(deepest) == 1 or not all(", got " in s for s in said):
            out.append((deepest[0], None))
            continue
        kinds = [s.split(", got ", 1)[0].removeprefix("must be ") for s in said]
        got = said[0].split(", got ", 1)[1]
        out.append((deepest[0], "must be " + " or ".join(dict.fromkeys(kinds)) + ", got " + got))
    return out


def _bracketed(loc: Sequence[Any]) -> str:
    """A pydantic error's ``loc`` as a key with each list index in brackets: ``tune.folds[0]``,
    ``methods[1].grid.train.lr``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).removeprefix(".")


def _named(key: str, option: str | None) -> str:
    """``key`` as the message names it: by itself, after ``--set``, the bench or a place of a file that wrote it
    (a label ending in ``:``, ``bench.yaml: set[0] 'trian.lr=0.01':``), or as the option that wrote it
    (``--algorithms``; ``--rounds (fl.rounds)``)."""
    if option is None:
        return key
    if option in ("--set", "the bench's") or option.endswith(":"):
        return f"{option} {key}"
    return option if key == option.lstrip("-") else f"{option} ({key})"


def _known_keys_hint(model: type[BaseModel] | None, loc: Sequence[Any]) -> str:
    """`` (did you mean 'rounds'?)`` or `` (known keys: ...)`` for the unknown last key of ``loc`` in ``model``."""
    import difflib

    for part in loc[:-1]:  # down to the section holding the unknown key (a list's index: the same item model)
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
    if model is None:
        return ""
    known = list(model.model_fields)
    if not known:
        return " (this section takes no keys)"
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(known)})"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field's annotation holds (``SplitConfig``, ``StopConfig | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, get_args(annotation)) if m is not None), None)


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def without_idle_methods(dump: dict, algorithms: list[str] | None = None) -> dict:
    """A ``RunConfig.model_dump`` without the ``methods`` options of algorithms not among ``algorithms`` (default: the
    dump's own): each algorithm reads only its own options, so another's change nothing in the run (a preset that
    sets FedSM's selector size must not change a FedAvg run's digest, resume check or bench reuse)."""
    names = set(dump.get("algorithms", []) if algorithms is None else algorithms)
    methods = dump.get("methods") or {}
    return {**dump, "methods": {name: options for name, options in methods.items() if name in names}}


def config_record(cfg: RunConfig) -> tuple[str, str]:
    """``(text, sha256 hex digest of its UTF-8 bytes)``: the configuration as a Flower run's coordinator and every
    site record it (``OUT/flower/run-config.json``, ``run-config__<site>__<digest prefix>.json``), so ``sha256sum``
    of either file is the digest both print, and the hospitals compare it with the study's agreed configuration.
    Keys sorted: ``methods`` options given in another order (``--set`` or YAML) are the same configuration (a
    security re-test found two digests for one); options of algorithms the run does not train are left out
    (:func:`without_idle_methods`)."""
    import hashlib
    import json

    text = json.dumps(without_idle_methods(cfg.model_dump(mode="json")), indent=2, sort_keys=True) + "\n"
    return text, hashlib.sha256(text.encode()).hexdigest()


def _sets(set_key: str, override: str, key: str) -> bool:
    """Whether ``--set override`` (of ``set_key``) gives ``key``: the key itself, a key inside it, or a section whose
    value (YAML) holds it (``fl={rounds: 2}`` sets ``fl.rounds``, ``fl={stop: {patience: 3}}`` does not)."""
    if set_key == key or set_key.startswith(key + "."):
        return True
    if not key.startswith(set_key + "."):
        return False
    try:
        value = yaml.safe_load(override.split("=", 1)[1])
    except yaml.YAMLError:
        return True  # unreadable: the run refuses it anyway, as a conflict or as YAML
    for part in key[len(set_key) + 1 :].split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def config_from_cli(
    preset,
    config,
    data,
    algorithms,
    rounds,
    seed,
    overrides,
    device: str | None = None,
    threads: int | None = None,
    tracking: Sequence[str] = (),
    workers: int | None = None,
) -> RunConfig:
    """The RunConfig of a ``run``-style command: preset or file, then ``--data``, ``--algorithms``,
    ``--rounds``, ``--seed``, ``--device``, ``--threads``, ``--workers``, ``--track`` (each value a name or
    comma-separated names; together they replace ``tracking``) and the ``--set`` overrides. A key given both by a
    named option and by ``--set`` (``--rounds 1 --set fl.rounds=2``) is refused in one line: one would silently win,
    and the other's value would go unchecked."""
    overrides = list(overrides)
    set_keys = {o.split("=", 1)[0].strip(): o for o in overrides if "=" in o}  # what --set gave, by key
    labels = {}  # key -> the option that wrote it, for the error message
    if data is not None:
        try:
            root = Path(data).resolve()
        except (OSError, RuntimeError) as e:  # a symlink loop
            raise ConfigError(f"--data {data}: cannot be resolved ({e})") from None
        overrides += ["data.source=folder", f"data.root={root}"]
        labels.update({"data.source": "--data", "data.root": "--data"})
    if algorithms is not None:
        names = [name.strip() for name in algorithms.split(",")]
        if not algorithms.strip():
            raise ConfigError("--algorithms is empty: name at least one algorithm (comma-separated)")
        if not all(names):
            raise ConfigError(f"--algorithms {algorithms!r}: an empty name (two commas in a row, or one at an end)")
        overrides.append(f"algorithms={yaml.safe_dump(names, default_flow_style=True).strip()}")
        labels["algorithms"] = "--algorithms"
    for option, key, value in (
        ("--rounds", "fl.rounds", rounds),
        ("--seed", "seed", seed),
        ("--device", "device", None if device is None else yaml.safe_dump(device, default_style=chr(34)).strip()),
        ("--threads", "threads", threads),
        ("--workers", "engine.workers", workers),
    ):
        if value is not None:
            overrides.append(f"{key}={value}")
            labels[key] = option
    if names := [n.strip() for value in tracking for n in value.split(",") if n.strip()]:
        overrides.append(f"tracking={yaml.safe_dump(names, default_flow_style=True).strip()}")
        labels["tracking"] = "--track"
    for key, option in labels.items():  # the same key, a key inside it, or a section holding it (--set fl={rounds: 2})
        given = next((k for k in set_keys if _sets(k, set_keys[k], key)), None)
        if given is not None:
            raise ConfigError(f"{option} and --set {set_keys[given]} both set {key}: give it once")
    return load_config(preset=preset, file=config, overrides=overrides, labels=labels)
