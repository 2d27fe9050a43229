"""Static signs that a submission reaches for the grading machinery (for the instructor to read).

The checker keeps the verdict out of the notebook's reach, but the code a check calls runs in
the check's own process and could still tamper with it. These flags point the instructor at
the usual ways of trying (they do not change any points): touching the course's checks or the
grader, the interpreter's frames, garbage collector or audit hooks, raw memory (ctypes),
another process (/proc, os.kill), leaving without a verdict (os._exit), custom pickling, or
replacing a function of a library the checks use (`torch.allclose = ...`). A determined author
can hide any of these from a text scan; INSTRUCTORS.md says how to run untrusted code.
"""
from __future__ import annotations

import ast
import re
import sys

__all__ = ["review_flags"]

_PATTERNS = [
    (r"course_utils\s*\.\s*(checks|grade|grading)|from\s+course_utils\s+import\s+[^\n]*\b(checks|grade|grading)\b",
     "imports the course's checks or grader"),
    (r"\b_REGISTRY\b|\brun_check\b|\bCheckResult\b|\brun_check_cell\b", "names the checks' internals"),
    (r"COURSE_RESULTS|COURSE_HANDIN_DIR|COURSE_CHECK_SEED|COURSE_STRICT", "reads or sets the grader's variables"),
    (r"sys\s*\.\s*modules|\b_getframe\b|\bf_back\b|\bf_globals\b|\bf_locals\b|\bsettrace\b|\bsetprofile\b"
     r"|\baddaudithook\b|\bgc\s*\.\s*get_(objects|referrers|referents)\b",
     "inspects or rewires the running interpreter (frames, sys.modules, gc, tracing)"),
    (r"\bctypes\b|/proc/|\bos\s*\.\s*(kill|killpg|getppid)\b|\bpsutil\b|\bprctl\b|\bptrace\b",
     "reaches into memory or other processes"),
    (r"\bvars\s*\(\s*(torch|np|numpy|math|builtins|operator)\b|\b(torch|np|numpy|math|builtins|operator)\s*\.\s*__dict__",
     "rewrites a library's namespace"),
    (r"\bos\s*\.\s*_exit\b", "leaves the process without a verdict (os._exit)"),
    (r"__reduce(_ex)?__|__setstate__|copyreg", "customises how its objects are copied to the grader"),
    (r"__builtins__|\bbuiltins\s*\.", "changes Python's builtins"),
]


def _imported_modules(tree) -> dict[str, str]:
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _is_module(full):
                    names[a.asname or a.name] = full
    return names


def _is_module(dotted: str) -> bool:
    return dotted in sys.modules


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            obj = module
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                return None
            return obj
    return None


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def _patches(tree, modules: dict[str, str], source: str) -> list[tuple[str, str]]:
    """(what, line) for each `module.function = ...` or setattr(module, ...): a library's callable replaced."""
    lines = source.splitlines()
    found = []

    def line(node):
        return lines[node.lineno - 1] if 0 < node.lineno <= len(lines) else ""

    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and isinstance(node.args[0], (ast.Name, ast.Attribute)):
                base = _dotted(node.args[0])
                if base and base.split(".")[0] in modules:
                    found.append((f"{node.func.id}({base}, ...)", line(node)))
            continue
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            dotted = _dotted(target)
            if not dotted or dotted.split(".")[0] not in modules:
                continue
            real = modules[dotted.split(".")[0]] + dotted[len(dotted.split(".")[0]):]
            current = _resolve(real)
            depth = dotted.count(".")
            if callable(current) or (current is None and depth == 1):
                found.append((f"{dotted} = ...", line(node)))
    return found


def review_flags(nb, released_lines=frozenset()) -> list[str]:
    """One sentence per suspicious code cell of a submission (empty when nothing looks odd).
    Lines that are the released lesson's own (`released_lines`, stripped) are not held against it."""
    flags = []
    modules = _notebook_modules(nb)
    for number, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code":
            continue
        own = "\n".join(line for line in cell.source.splitlines() if line.strip() not in released_lines)
        if not own.strip():
            continue
        reasons = [why for pattern, why in _PATTERNS if re.search(pattern, own)]
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            tree = None
        if tree is not None:
            patches = [p for p, line in _patches(tree, modules | _imported_modules(tree), cell.source)
                       if line.strip() not in released_lines]
            if patches:
                reasons.append("replaces a library function (" + ", ".join(sorted(set(patches))[:3]) + ")")
        if reasons:
            flags.append(f"cell {number} " + "; ".join(dict.fromkeys(reasons)))
    return flags


def _notebook_modules(nb) -> dict[str, str]:
    names = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            try:
                names |= _imported_modules(ast.parse(cell.source))
            except SyntaxError:
                pass
    return names


_RISKY_MODULES = ("os", "posix", "nt", "sys", "subprocess", "ctypes", "gc", "importlib", "pickle", "marshal",
                  "code", "codeop", "signal", "shutil", "socket", "inspect", "runpy", "pty", "threading")
_RISKY_BUILTINS = {"exec", "eval", "compile", "setattr", "delattr", "__import__", "globals", "locals", "open",
                   "breakpoint", "vars"}


def pickle_flags(data: bytes) -> list[str]:
    """What a handed-in pickle would call while it is loaded, when that looks like tampering.

    Read with pickletools (nothing is executed). A normal cloudpickle of a function or class
    references cloudpickle's own constructors and the modules and classes it uses; a pickle
    written to attack the checker calls setattr/exec/os functions or the checks themselves
    as it loads."""
    import pickletools
    found, strings = [], []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
                               "BINSTRING", "STRING"):
                strings.append(str(arg))
            elif opcode.name in ("GLOBAL", "INST"):
                module, _, name = str(arg).partition(" ")
                found.append((module, name))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append((strings[-2], strings[-1]))
    except Exception as exc:
        return [f"the handed-in data is not a well-formed pickle ({type(exc).__name__})"]
    flags = []
    for module, name in found:
        top = module.split(".")[0]
        if module.startswith(("course_utils.checks", "course_utils.grading", "course_utils.grade")):
            flags.append(f"{module}.{name}")
        elif module in ("builtins", "__builtin__") and name in _RISKY_BUILTINS:
            flags.append(f"builtins.{name}")
        elif top in _RISKY_MODULES:
            flags.append(f"{module}.{name}")
    if not flags:
        return []
    shown = ", ".join(sorted(set(flags))[:4])
    return [f"the object handed in calls {shown} while it is loaded (a pickle built to act on the checker?)"]
