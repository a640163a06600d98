"""The packages' import order (docs/layout.md): every project module imports only modules of
its own layer or of a lower one, at the top of the file or inside a function, and no two
modules import each other, directly or around a cycle."""

import ast
import re
import pathlib

ROOT = pathlib.Path(__file__).parents[1]

# lowest first; a module belongs to the layer of the longest name here that is its own name or
# its package's ("tf_transformer" alone: the package's __init__, the `load` of the API)
LAYERS = (
    ("common",),
    ("data_pipeline",),
    ("tf_transformer.config", "tf_transformer.layers", "tf_transformer.model",
     "tf_transformer.model_dir", "tf_transformer.runtime"),
    ("tf_transformer.decoding",),
    ("tf_transformer.checkpoints", "tf_transformer.length_batching", "tf_transformer.marian"),
    ("tf_transformer.serving",),
    ("tf_transformer.training",),
    ("tf_transformer.inference", "tf_transformer.loading", "tf_transformer"),
    ("export",),
    ("tf_transformer.bin", "tf_transformer.train"),
)
_EXACT = {"tf_transformer"}


def layer_of(module: str) -> int:
  """The index in LAYERS of a project module's layer."""
  matches = [(len(name), index) for index, names in enumerate(LAYERS) for name in names
             if module == name or (module.startswith(name + ".") and name not in _EXACT)]
  assert matches, f"{module} is in no layer: add it to LAYERS and to docs/layout.md"
  return max(matches)[1]


def project_modules() -> dict:
  """{dotted module name: path} of every library module (not tests, bench or docs)."""
  modules = {}
  for package in ("common", "data_pipeline", "tf_transformer", "export"):
    for path in sorted((ROOT / package).rglob("*.py")):
      parts = list(path.relative_to(ROOT).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      modules[".".join(parts)] = path
  return modules


def imports_of(path: pathlib.Path, modules: dict) -> set:
  """The project modules that `path` imports anywhere in it (a `from package import name`
  counts as package.name when that is a module, else as the package)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
               else node.module for alias in node.names]
    else:
      continue
    found.update(name for name in names if name in modules)
  return found


def test_every_module_imports_only_its_layer_and_those_below():
  modules = project_modules()
  upward = []
  for module, path in modules.items():
    for imported in imports_of(path, modules):
      if layer_of(imported) > layer_of(module):
        upward.append(f"{module} (layer {layer_of(module)}) imports {imported} "
                      f"(layer {layer_of(imported)})")
  assert not upward, "\n".join(upward)


def test_no_import_cycle():
  modules = project_modules()
  graph = {module: imports_of(path, modules) - {module} for module, path in modules.items()}
  # a package's __init__ imports its own modules (their being imported runs it first): only
  # a module's import of a module that imports it back, around any path, is a cycle
  for module in graph:
    graph[module] = {m for m in graph[module] if not module.startswith(m + ".")}
  state, cycles = {}, []

  def visit(module, path):
    state[module] = "open"
    for imported in sorted(graph[module]):
      if state.get(imported) == "open":
        cycles.append(" -> ".join(path[path.index(imported):] + [imported]))
      elif imported not in state:
        visit(imported, path + [imported])
    state[module] = "done"

  for module in sorted(graph):
    if module not in state:
      visit(module, [module])
  assert not cycles, "\n".join(cycles)


def test_the_layers_name_every_module():
  for module in project_modules():
    layer_of(module)


def test_no_flag_outside_the_tools():
  """Library code speaks in config fields; only tf_transformer.bin defines and reads flags."""
  found = []
  for module, path in project_modules().items():
    if layer_of(module) == len(LAYERS) - 1:  # the tools
      continue
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      names = []
      if isinstance(node, ast.ImportFrom) and node.module == "absl":
        names = [f"absl.{alias.name}" for alias in node.names]
      elif isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      if "absl.flags" in names:
        found.append(f"{module}:{node.lineno} imports absl.flags")
      if isinstance(node, ast.Name) and node.id in ("FLAGS", "FlagError"):
        found.append(f"{module}:{node.lineno} reads {node.id}")
      if isinstance(node, ast.Attribute) and (node.attr == "present"
                                              or node.attr.startswith("DEFINE_")):
        found.append(f"{module}:{node.lineno} uses .{node.attr}")
  assert not found, "\n".join(found)


def _tool_flags() -> set:
  """The names of the flags the tools define: the first argument of each module-level call in
  tf_transformer.bin of absl's DEFINE_* or of a module's own helper around it (`_integer`)."""
  from tf_transformer.bin import cli
  names = set(cli.FLAG_OF_FIELD.values())
  for path in (ROOT / "tf_transformer" / "bin").glob("*.py"):
    for statement in ast.parse(path.read_text(), str(path)).body:
      call = statement.value if isinstance(statement, ast.Expr) else None
      if not (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant)
              and isinstance(call.args[0].value, str)):
        continue
      function = call.func
      if ((isinstance(function, ast.Attribute) and function.attr.startswith("DEFINE_"))
          or (isinstance(function, ast.Name) and function.id.startswith("_"))):
        names.add(call.args[0].value)
  return names


def test_library_text_names_fields_not_flags():
  """Library messages, logs and docstrings name config fields ("vocab_size=8"); the tools show
  an error's fields as their flags (common.errors.UserError), so no library text says
  "--vocab_size" to a Python caller. Other programs' flags (TF Serving's) may be named."""
  tool_flags = _tool_flags()
  assert {"model_dir", "vocab_size", "batching_max_size", "beam_size"} <= tool_flags
  found = []
  for module, path in project_modules().items():
    if layer_of(module) == len(LAYERS) - 1:  # the tools
      continue
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        for name in re.findall(r"--(?:no)?(\w+)", node.value):
          if name in tool_flags or name.removeprefix("no") in tool_flags:
            found.append(f"{module}:{node.lineno} names --{name}")
  assert not found, "\n".join(found)
