"""``topicwire completion bash|zsh``: a shell completion script, generated from the command
line's own parser (every command, sub-command and option), so it cannot drift from it.

    eval "$(topicwire completion bash)"        # in ~/.bashrc
    eval "$(topicwire completion zsh)"         # in ~/.zshrc (uses bashcompinit)

The script is static: completing a word runs no Python.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``completion``."""
    parser = subparsers.add_parser(
        "completion", help="print a bash or zsh completion script (eval it in your shell rc)")
    parser.add_argument("shell", choices=("bash", "zsh"))
    parser.set_defaults(handler=run)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings)


def words(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Completion words by command path: ``""`` -> commands and global options, ``"bench"``
    -> its sub-commands and options, ``"bench fabric"`` -> that one's options, ..."""
    out: dict[str, list[str]] = {}

    def walk(path: str, p: argparse.ArgumentParser) -> None:
        subs = _subparsers(p)
        out[path] = sorted(subs) + _options(p)
        for name, sub in subs.items():
            walk(f"{path} {name}".strip(), sub)

    walk("", parser)
    return out


def bash_script(parser: argparse.ArgumentParser) -> str:
    cases = "\n".join(f'        "{path}") words="{" ".join(ws)}" ;;'
                      for path, ws in sorted(words(parser).items()))
    return f'''# topicwire completion (bash; zsh through bashcompinit)
_topicwire() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" w i words=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        case "$w" in -*) continue ;; esac
        case " $(_topicwire_words "${{path:+$path }}$w") " in
            "  ") ;;
            *) path="${{path:+$path }}$w" ;;
        esac
    done
    words="$(_topicwire_words "$path")"
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=($(compgen -f -- "$cur"))
    return 0
}}
_topicwire_words() {{
    local words=""
    case "$1" in
{cases}
    esac
    printf '%s' "$words"
}}
complete -F _topicwire topicwire
'''


def run(args: argparse.Namespace) -> int:
    from appliance.ops.cli import build_parser

    script = bash_script(build_parser())
    if args.shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    print(script, end="")
    return 0
