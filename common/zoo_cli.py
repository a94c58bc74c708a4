"""``zoo``: the zoo's commands in one place (installed by ``pip install -e .``).

    zoo list                             the model folders and their configs
    zoo info MODEL                       what a folder is: configs, params and defaults, size, last compile
    zoo new NAME --from pytorch/mnist    a copy of a folder, its names and model_dir adjusted
    zoo prepare [DATASET ...]            put a data set on local disk (datasets/prepare_<name>.py)
    zoo compile [MODEL ...]              validate and compile each folder's tiny config (tox -e compile)
    zoo train [MODEL ...]                train each tiny config on cpu and the emulator (tox -e train)
    zoo convert SRC [DST]                list or convert a checkpoint (.mdl, .pt, .safetensors, TF, Hugging Face)
    zoo config check FILE                load a params file against its folder's defaults
    zoo port check PATH                  what stands between your code and the wafer, in fix order
    zoo port migrate SRC --out DEST      a folder of the vendor's zoo copied, its imports rewritten to this zoo's
    zoo port vendor-check CHECKOUT       the vendor's nine PyTorch folders migrated, prepared, trained, compiled
    zoo completion bash|zsh              shell completion: eval "$(zoo completion bash)"

MODEL is a folder of the zoo as ``zoo list`` prints it (``pytorch/mnist``), a bare name
(``mnist``: every framework's), or the path of any folder holding a run.py. The earlier
entry points stay: ``python -m common.zoo list|compile|train``, each ``run.py``, and
``python datasets/prepare_mnist.py``. Bad input is one ``error:`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time

from common import zoo
from common.errors import UserError
from common.io import not_written

PROG = "zoo"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage is one --help away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# --- models ---------------------------------------------------------------------------------

def model_names() -> list[str]:
    return [os.path.relpath(f, zoo.ROOT) for f in zoo.model_folders()]


def resolve_model(name: str) -> list[str]:
    """The folders MODEL names: ``pytorch/mnist``, ``mnist`` (each framework's), or a path with a run.py."""
    if os.path.isfile(os.path.join(name, "run.py")):
        return [os.path.abspath(name)]
    folders = zoo.model_folders()
    exact = [f for f in folders if os.path.relpath(f, zoo.ROOT) == name.strip("/")]
    bare = [f for f in folders if os.path.basename(f) == name]
    if exact or bare:
        return exact or bare
    raise UserError(f"no model {name!r}: give one of {', '.join(model_names())}, or the path of a folder with a "
                    "run.py")


def resolve_models(names: list[str], framework: str | None) -> list[str]:
    if not names:
        return zoo.model_folders(framework)
    folders = [f for n in names for f in resolve_model(n)]
    if framework:
        folders = [f for f in folders if os.path.basename(os.path.dirname(f)) == framework]
    return list(dict.fromkeys(folders))


def framework_of(folder: str) -> str:
    """pytorch or tf, from what run.py hands its callables to."""
    try:
        with open(os.path.join(folder, "run.py"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        raise UserError(f"{folder}: no run.py") from None
    if "common.pytorch" in text:
        return "pytorch"
    if "common.tf" in text:
        return "tf"
    raise UserError(f"{folder}/run.py: hands its model neither to common.pytorch.run nor to common.tf.run")


def shown(folder: str) -> str:
    relative = os.path.relpath(folder, zoo.ROOT)
    return relative if not relative.startswith("..") else folder


# --- zoo list / info --------------------------------------------------------------------------

def summary_line(folder: str) -> str:
    """What the folder is: its README's first sentence (or model.py's docstring)."""
    readme = os.path.join(folder, "README.md")
    if os.path.isfile(readme):
        with open(readme, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
        heading = next((line.lstrip("# ") for line in lines if line.startswith("#")), "")
        if ":" in heading:  # "# pytorch/mnist: an MLP on handwritten digits"
            return heading.split(":", 1)[1].strip()
        paragraph = []  # the first paragraph of prose, joined
        for line in lines:
            if line and not line.startswith(("#", "|", "```")):
                paragraph.append(line)
            elif paragraph:
                break
        if paragraph:
            return re.split(r"(?<=\.)\s|:\s", " ".join(paragraph))[0].rstrip(".:")
    return ""


def cmd_list(args) -> int:
    folders = zoo.model_folders(args.framework)
    if args.names:
        print("\n".join(shown(f) for f in folders))
        return 0
    width = max((len(shown(f)) for f in folders), default=0)
    for folder in folders:
        configs = [os.path.splitext(os.path.basename(p))[0] for p in sorted(glob.glob(os.path.join(folder, "configs",
                                                                                                    "*.yaml")))]
        print(f"{shown(folder):<{width}}  configs: {', '.join(configs) or '-'}  {summary_line(folder)}")
    return 0


NO_DEFAULTS = "no defaults function"


def _defaults_function(folder: str):
    """(the folder's defaults function, its form, its name) as run.py hands it over (utils.default_params or
    set_defaults); a folder whose utils.py has neither, or that has no utils.py, passes none, as the vendor's
    gpt2 does (run()'s default_params_fn is optional): its configs load as they are written."""
    from common.folder import import_beside
    from common.params import defaults_form

    if os.path.isfile(os.path.join(folder, "utils.py")):
        utils = import_beside(os.path.join(folder, "utils.py"), "utils")
        for name in ("default_params", "set_defaults"):
            fn = getattr(utils, name, None)
            if callable(fn):
                return fn, defaults_form(fn), f"utils.{name}"
    return None, "vendor", NO_DEFAULTS


def _flat(mapping, prefix: str = "") -> list[tuple[str, object]]:
    from common.params import Typed

    out = []
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _flat(value, name + ".")
        elif isinstance(value, Typed):
            choices = f" ({' | '.join(map(str, value.choices))})" if value.choices else ""
            out.append((name, f"{value.default!r}{choices}"))
        else:
            out.append((name, repr(value)))
    return out


def _load_config(folder: str, path: str, defaults_fn, form: str, framework: str, overrides=()):
    from common.cli import default_model_dir
    from common.params import load_params, load_vendor_params, thaw

    model_dir = default_model_dir(framework, folder, path)
    if form == "vendor":
        return thaw(load_vendor_params(path, defaults_fn, list(overrides), mode="train", model_dir=model_dir))
    return thaw(load_params(path, defaults_fn(), list(overrides), model_dir=model_dir))


def last_compile(folder: str, framework: str) -> tuple[str, dict] | None:
    """The newest compile report of the folder under ./model_dir (any of its configs), if one was written."""
    name = f"{framework}_{os.path.basename(os.path.abspath(folder))}"
    reports = glob.glob(os.path.join("model_dir", name, "compile", "report.json")) + glob.glob(
        os.path.join("model_dir", f"{name}_*", "compile", "report.json"))
    for path in sorted(reports, key=os.path.getmtime, reverse=True):
        try:
            with open(path, encoding="utf-8") as f:
                return path, json.load(f)
        except (OSError, ValueError):
            continue
    return None


def cmd_info(args) -> int:
    folders = resolve_model(args.model)
    for i, folder in enumerate(folders):
        if i:
            print()
        framework = framework_of(folder)
        print(f"{shown(folder)}: {summary_line(folder) or '(no README.md)'}")
        print(f"  folder      {folder}")
        missing = zoo.missing_files(folder)
        print(f"  files       {'all of the skeleton' if not missing else 'missing ' + ', '.join(missing)}")
        defaults_fn, form, fn_name = _defaults_function(folder)
        if fn_name == NO_DEFAULTS:
            how = "run() is given none: the configs load as written"
        else:
            how = "the zoo's form: the defaults are the schema" if form == "zoo" else \
                "the vendor's form: fills the config's params in place"
        print(f"  defaults    {fn_name} ({how})")
        for path in sorted(glob.glob(os.path.join(folder, "configs", "*.yaml"))):
            try:
                params = _load_config(folder, path, defaults_fn, form, framework)
            except UserError as e:
                print(f"  config      {os.path.basename(path)}: does not load: {e}")
                continue
            rc = params["runconfig"]
            batch = params.get("train_input", {}).get("batch_size", "?")
            print(f"  config      {os.path.basename(path)}: train batch {batch}, max_steps {rc['max_steps']}, "
                  f"model_dir {rc['model_dir']}, device {params['device']['profile']} "
                  f"{params['device']['execution_mode']}")
        if form == "zoo":
            for key, value in _flat(defaults_fn()):
                print(f"  param       {key} = {value}")
        report = last_compile(folder, framework)
        if report is None:
            print(f"  size        not known until compiled: zoo compile {shown(folder)}")
            print("  estimate    none yet (no compile report under ./model_dir)")
            continue
        path, data = report
        perf = data.get("performance", {})
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(path)))
        print(f"  size        {data.get('num_params', 0):,} parameters ({path})")
        print(f"  estimate    {perf.get('samples_per_s', 0):,.0f} samples/s at batch {perf.get('batch_size')}, bound "
              f"by {perf.get('bound_by')}, {data.get('execution_mode')} on {data.get('profile')} "
              f"(last compile, {when}; an estimate of the emulator's cost model)")
    return 0


# --- zoo new ---------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TEXT = (".py", ".yaml", ".yml", ".md", ".txt", ".json", ".cfg")


def cmd_new(args) -> int:
    if not _NAME.fullmatch(args.name):
        raise UserError(f"new model name {args.name!r}: use letters, digits and underscores (it names the folder and "
                        "its model_dir)")
    sources = resolve_model(args.source)
    if len(sources) != 1:
        raise UserError(f"--from {args.source} names {len(sources)} folders: give one, e.g. "
                        f"{', '.join(shown(s) for s in sources)}")
    source = sources[0]
    framework = framework_of(source)
    dest = os.path.abspath(args.dest or os.path.join(zoo.ROOT, framework, args.name))
    if os.path.exists(dest):
        raise UserError(f"{dest} already exists: choose another name or --dest")
    old, new = os.path.basename(source), args.name
    replacements = [(f"{framework}/{old}", shown(dest)), (f"{framework}_{old}", f"{framework}_{new}")]
    staging = dest + ".zoo-new-tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "model_dir"))
    changed = []
    for root, _, files in os.walk(staging):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, staging)
            if rel == "README.md":
                _write(path, _readme_stub(shown(dest), shown(source), framework, new))
                changed.append(rel)
                continue
            if not name.endswith(_TEXT):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            edited = text
            for a, b in replacements:
                edited = edited.replace(a, b)
            if rel.startswith("configs") and name.endswith((".yaml", ".yml")):
                # a model_dir set in the copy's config would resume the original's checkpoints: derive it
                edited = re.sub(r"(?m)^(\s*)model_dir:.*$", rf"\1# model_dir: derived, model_dir/{framework}_{new}",
                                edited)
            if edited != text:
                _write(path, edited)
                changed.append(rel)
    os.rename(staging, dest)
    here = os.path.relpath(dest)  # the commands below, as typed from the working directory
    here = dest if here.startswith("..") else here
    print(f"created {here} from {shown(source)}; names adjusted in {', '.join(sorted(changed)) or 'no file'}")
    print(f"  checkpoints go to model_dir/{framework}_{new} (the folder's own; set runconfig.model_dir to change it)")
    print(f"  next: put your model in {here}/model.py and your data code in {here}/data.py, then")
    print(f"        zoo port check {here}")
    print(f"        python {here}/run.py --mode train --params {here}/configs/params_tiny.yaml")
    return 0


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _readme_stub(dest: str, source: str, framework: str, name: str) -> str:
    return f"""# {dest}: (what the model is, in one line)

Started from [{source}]({os.path.relpath(os.path.join(zoo.ROOT, source), os.path.join(zoo.ROOT, dest))}) with
`zoo new {name} --from {source}`. Say here what the model is, the exact command that trains it and the
result it gives (the original's result table was not copied: it measured the original).

| file | what it holds |
|---|---|
| `model.py` | the model and `model_fn` |
| `data.py` | the data functions |
| `utils.py` | the params keys the model reads, with their defaults |
| `configs/params.yaml` | the run's settings; `configs/params_tiny.yaml`: a few steps in seconds |
| `run.py` | hands the callables to the shared runner |

    zoo port check {dest}
    python {dest}/run.py --mode train --params {dest}/configs/params_tiny.yaml

Checkpoints go to `model_dir/{framework}_{name}`.
"""


# --- zoo prepare --------------------------------------------------------------------------------

def datasets() -> dict[str, str]:
    """Data set name -> its preparation script (datasets/prepare_<name>.py)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(zoo.ROOT, "datasets", "prepare_*.py"))):
        found[os.path.basename(path)[len("prepare_"):-3]] = path
    return found


def _script_module(path: str):
    spec = importlib.util.spec_from_file_location(f"zoo_prepare_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cmd_prepare(args) -> int:
    available = datasets()
    if args.names:
        print("\n".join(available))
        return 0
    if args.dataset is None:
        width = max(map(len, available), default=0)
        for name, path in available.items():
            doc = (_script_module(path).__doc__ or "").strip().splitlines()
            print(f"{name:<{width}}  {doc[0] if doc else ''}   ({os.path.relpath(path, zoo.ROOT)})")
        print("zoo prepare DATASET --help: that data set's options")
        return 0
    if args.dataset not in available:
        raise UserError(f"no data set {args.dataset!r} to prepare: {', '.join(available)} (datasets/README.md)")
    module = _script_module(available[args.dataset])
    sys.argv[0] = f"{PROG} prepare {args.dataset}"  # the script's argparse names itself after argv[0]
    return int(module.main(args.rest) or 0)


# --- zoo compile / train -------------------------------------------------------------------------

def cmd_stages(args) -> int:
    folders = resolve_models(args.models, args.framework)
    if not folders:
        raise UserError("no model folder to run")
    return zoo.run_stages(args.command, folders, keep_reports=args.command == "compile")


# --- zoo convert ----------------------------------------------------------------------------------

def cmd_convert(args) -> int:
    from common import convert

    if args.dst is None:
        print("\n".join(convert.listing(args.src)))
        return 0
    if os.path.exists(args.dst) and not args.force:
        raise UserError(f"{args.dst} exists: --force to replace it")
    print(convert.convert(args.src, args.dst, params=args.params))
    return 0


# --- zoo config check ------------------------------------------------------------------------------

def config_folder(path: str, model: str | None) -> str:
    if model:
        folders = resolve_model(model)
        if len(folders) != 1:
            raise UserError(f"--model {model} names {len(folders)} folders: give one")
        return folders[0]
    here = os.path.dirname(os.path.abspath(path))
    for candidate in (os.path.dirname(here) if os.path.basename(here) == "configs" else None, here):
        if candidate and any(os.path.isfile(os.path.join(candidate, f)) for f in ("utils.py", "run.py")):
            return candidate
    raise UserError(f"{path}: not in a model folder's configs/: say whose defaults it goes with, --model FOLDER")


def cmd_config(args) -> int:
    if not os.path.isfile(args.file):
        print(f"error: {args.file}: no such params file", file=sys.stderr)
        return 2
    folder = config_folder(args.file, args.model)
    framework = framework_of(folder)
    defaults_fn, form, fn_name = _defaults_function(folder)
    try:
        params = _load_config(folder, args.file, defaults_fn, form, framework, args.overrides)
    except UserError as e:
        print(f"{e}")
        print(f"{args.file}: does not load against {shown(folder)}'s {fn_name}")
        return 1
    how = "the file as written" if fn_name == NO_DEFAULTS else f"the {'zoo' if form == 'zoo' else 'vendor'}'s form"
    print(f"{args.file}: loads against {shown(folder)}'s {fn_name} ({how}); "
          f"model_dir {params['runconfig']['model_dir']}")
    if args.show:
        import yaml

        print(yaml.safe_dump(params, sort_keys=False, default_flow_style=False), end="")
    return 0


# --- zoo port check ---------------------------------------------------------------------------------

def cmd_port(args) -> int:
    from common.port import check

    return check.run(args)


def cmd_port_migrate(args) -> int:
    from common.port import migrate

    return migrate.run(args)


def cmd_port_vendor_check(args) -> int:
    from common.port import vendor_check

    return vendor_check.run(args)


# --- zoo completion -----------------------------------------------------------------------------------

def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A bash completion function from the parser itself: commands, their options and choices,
    model names (``zoo list --names``) and data sets (``zoo prepare --names``); files otherwise."""
    commands = _subcommands(parser)
    dynamic = {"info": "$(zoo list --names 2>/dev/null)", "compile": "$(zoo list --names 2>/dev/null)",
               "train": "$(zoo list --names 2>/dev/null)", "prepare": "$(zoo prepare --names 2>/dev/null)"}
    cases = []
    for name, sub in commands.items():
        nested = _subcommands(sub)
        if nested:
            cases.append(f'    "{name}") words="{" ".join(nested)}" ;;')
            for inner, parser_ in nested.items():
                cases.append(f'    "{name} {inner}"*) words="{_words(parser_)}" ;;')
        else:
            extra = f" {dynamic[name]}" if name in dynamic else ""
            cases.append(f'    {name}|"{name} "*) words="{_words(sub)}{extra}" ;;')
    script = f"""# zoo shell completion ({shell}); add to your shell's rc file:  eval "$(zoo completion {shell})"
_zoo_complete() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" words key
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{' '.join(commands)} --help" -- "$cur")); return
  fi
  if [ "$prev" = "--from" ]; then COMPREPLY=($(compgen -W "$(zoo list --names 2>/dev/null)" -- "$cur")); return; fi
  key="${{COMP_WORDS[1]}}"
  if [ "$COMP_CWORD" -ge 3 ]; then key="${{COMP_WORDS[1]}} ${{COMP_WORDS[2]}}"; fi
  case "$key" in
{chr(10).join(cases)}
    *) words="" ;;
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _zoo_complete zoo
"""
    if shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    return script


def _words(parser: argparse.ArgumentParser) -> str:
    """A command's option strings and the choices of its positional arguments."""
    words = [o for a in parser._actions for o in a.option_strings]
    words += [str(c) for a in parser._actions if not a.option_strings and a.choices for c in a.choices]
    return " ".join(words)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cmd_completion(args) -> int:
    print(completion_script(build_parser(), args.shell), end="")
    return 0


# --- the parser -------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="The wafer model zoo's commands.",
                     epilog="Each command has --help. Shell completion: eval \"$(zoo completion bash)\".",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = commands.add_parser("list", help="the model folders and their configs",
                            description="The model folders (tf/*, pytorch/*), their configs and what each is.")
    p.add_argument("--framework", choices=zoo.FRAMEWORKS)
    p.add_argument("--names", action="store_true", help="the names only, one a line (for scripts and completion)")
    p.set_defaults(func=cmd_list)

    p = commands.add_parser("info", help="a folder's configs, params, size and last compile estimate",
                            description="What a model folder holds: its configs (batch, steps, model_dir, device), "
                                        "its params and their defaults, its size and the estimate of its last "
                                        "compile under ./model_dir.")
    p.add_argument("model", metavar="MODEL", help="pytorch/mnist, mnist, or a folder's path")
    p.set_defaults(func=cmd_info)

    p = commands.add_parser("new", help="copy a folder to start a model of your own",
                            description="Copy a model folder under a new name: names in its files and comments "
                                        "adjusted, its model_dir derived from the new name, a README to fill in.")
    p.add_argument("name", metavar="NAME", help="the new model's name (letters, digits, underscores)")
    p.add_argument("--from", dest="source", required=True, metavar="MODEL", help="the folder to copy, e.g. "
                                                                                 "pytorch/mnist")
    p.add_argument("--dest", metavar="DIR", help="where the copy goes (default: <framework>/NAME in the zoo)")
    p.set_defaults(func=cmd_new)

    p = commands.add_parser("prepare", help="put a data set on local disk",
                            description="Run a data set's preparation (datasets/prepare_<name>.py); with no data "
                                        "set, list them. Everything after DATASET goes to its script.",
                            add_help=True)
    p.add_argument("--names", action="store_true", help="the data sets' names only, one a line")
    p.add_argument("dataset", metavar="DATASET", nargs="?", help="e.g. mnist")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the script's own options (zoo prepare mnist --help)")
    p.set_defaults(func=cmd_prepare)

    for name, what in (("compile", "validate and compile the tiny config of each folder (tox -e compile); the "
                                   "report stays in ./model_dir/<framework>_<folder>_tiny/compile"),
                       ("train", "train the tiny config of each folder on the cpu and on the emulator; the loss "
                                 "must fall (tox -e train)")):
        p = commands.add_parser(name, help=what.split(";")[0].split(" (")[0], description=what[0].upper() + what[1:]
                                + ". Each folder runs in a process of its own. With no MODEL: every folder.")
        p.add_argument("models", nargs="*", metavar="MODEL", help="pytorch/mnist, mnist, or a folder's path")
        p.add_argument("--framework", choices=zoo.FRAMEWORKS)
        p.set_defaults(func=cmd_stages)

    p = commands.add_parser("convert", help="list or convert a checkpoint",
                            description=_doc_block("common.convert"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help=".mdl, .pt/.pth/.bin, .safetensors, a TF model.ckpt-N or model_dir, "
                                              "a Hugging Face directory")
    p.add_argument("dst", metavar="DST", nargs="?", help="the file to write (its extension says the format; none: a "
                                                          "Hugging Face directory); without it, list SRC")
    p.add_argument("--params", help="to Hugging Face: the zoo params file of the model (default: the "
                                    "params_train.yaml beside SRC)")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=cmd_convert)

    p = commands.add_parser("config", help="check a params file", description="Params files.")
    config = p.add_subparsers(dest="config_command", metavar="COMMAND", required=True, parser_class=_Parser)
    c = config.add_parser("check", help="load a params file against its folder's defaults",
                          description="Load FILE (and its base: files) against the model folder's defaults, as the "
                                      "runner does: unknown keys, wrong types and out-of-range sizes, counts and "
                                      "rates are one line naming the key, file and line (exit 1). Either defaults "
                                      "form: default_params() or the vendor's set_defaults(params).")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--model", metavar="FOLDER", help="whose defaults (default: the folder FILE's configs/ is in)")
    c.add_argument("--show", action="store_true", help="print the effective params")
    c.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides, as run.py takes them")
    c.set_defaults(func=cmd_config)

    p = commands.add_parser("port", help="what stands between your code and the wafer",
                            description="The porting assistant.")
    port = p.add_subparsers(dest="port_command", metavar="COMMAND", required=True, parser_class=_Parser)
    from common.port import check

    c = port.add_parser("check", help="list every change a port needs, in fix order",
                        description=_doc_block("common.port.check"),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_arguments(c)
    c.set_defaults(func=cmd_port)
    from common.port import migrate

    c = port.add_parser("migrate", help="copy a folder of the vendor's zoo, its imports and TF 2.2 names rewritten",
                        description=_doc_block("common.port.migrate"),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    migrate.add_arguments(c)
    c.set_defaults(func=cmd_port_migrate)
    from common.port import vendor_check

    c = port.add_parser("vendor-check", help="the vendor's PyTorch folders migrated, prepared, trained, evaluated, "
                                             "compiled and trained on the emulator",
                        description=_doc_block("common.port.vendor_check"),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    vendor_check.add_arguments(c)
    c.set_defaults(func=cmd_port_vendor_check)

    p = commands.add_parser("completion", help="print a shell completion script",
                            description='Print the completion script; load it with eval "$(zoo completion bash)" '
                                        "in ~/.bashrc (zsh: the same with zsh, in ~/.zshrc).")
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=cmd_completion)
    return parser


def _doc_block(module: str) -> str:
    """A module's docstring as --help text (its rst quotes dropped)."""
    return (importlib.import_module(module).__doc__ or "").replace("``", "")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # overrides (section.key=value) may follow options, as with run.py: argparse leaves them over
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `zoo convert x.mdl | head`: the reader has gone, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a full disk: one line naming the file not written
        error = not_written(e)
        if error is None:
            raise
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
