"""A ComfyUI stand-in for tests and the demo: loads custom nodes as ComfyUI does, runs prompts
on a simulated card.

Source: issue 13 ("A ComfyUI stand-in in the simulation kit"); reference/hosts.md "ComfyUI";
ComfyUI's ``main.py`` (``start_comfyui``, ``prompt_worker``), ``server.py`` (``PromptServer``),
``execution.py`` (``PromptQueue``) and ``nodes.py`` (``load_custom_node``), read at 0.3.64.
Run as ``berth sim comfyui --port P --models DIR [--custom-node PATH]…``.

What a custom node sees is named as in ComfyUI: the modules ``server`` (``PromptServer`` with
``instance``, ``app``, ``routes``, ``prompt_queue``, ``loop``, ``send_sync``,
``send_progress_text``: :mod:`berth.sim.comfyui_server`), ``execution`` (``PromptQueue`` with
``put/get/task_done/get_tasks_remaining/set_flag/get_flags``), ``nodes``
(``NODE_CLASS_MAPPINGS``, ``interrupt_processing``), ``folder_paths`` (``get_full_path``,
``models_dir``), ``comfy.cli_args.args`` (``highvram``, ``gpu_only``, ``cpu``, ``port``,
``listen``, ``disable_dynamic_vram``, ``disable_nvml_pressure``, ``vram_headroom``,
``reserve_vram``), ``comfy.model_management`` (``current_loaded_models``, ``unload_all_models``,
``get_torch_device``, ``get_total_memory``) and, with dynamic VRAM, ``comfy.memory_management.
aimdo_enabled`` and ``comfy_aimdo.control`` as comfy-aimdo 0.5.3 and later offer it
(``init(simple_vram_headroom=N, nvml_pressure=B)``, ``set_simple_vram_headroom``,
``get_simple_vram_headroom``, ``lib``).

Startup follows ``main.py``: with dynamic VRAM, ``comfy_aimdo.control.init(simple_vram_headroom=
<--reserve-vram>, nvml_pressure=not --disable-nvml-pressure)``; the CUDA context (``--residual``)
is allocated, ``PromptServer`` is created, custom nodes are imported from their file path inside
a coroutine on the server's loop (an import error is logged "IMPORT FAILED" and skipped),
``add_routes()`` registers every route as ``/x`` and ``/api/x``, the ``prompt_worker`` thread
starts, ``AppRunner.setup()`` freezes the app (a middleware added later raises
``RuntimeError``), and ``publish_loop`` sends what ``send_sync`` queued to the websockets.

Memory, in bytes, on one simulated card, held by this process: the context; each model a loader
node names, allocated at the size of its file on disk when the prompt reaches that node and kept
loaded afterwards (smart memory); ``--activation`` bytes while a sampler runs. Without room on the
card a load evicts loaded models first (least recently used, as ``free_memory`` does), then
allocates; what still does not fit is an out-of-memory error on the card (counted by the store)
and the prompt fails. ``unload_models``/``free_memory`` flags, applied by the worker between
prompts, free every model, except under ``--highvram``/``--gpu-only``, where the GPU is the
offload device and unloading frees nothing. Dynamic VRAM (on unless ``--disable-dynamic-vram``,
as in ComfyUI 0.24) loads a model only partly when the card, less comfy-aimdo's simple headroom
(``--reserve-vram`` GB at start, changed while running through ``comfy_aimdo.control``: what
Berth's node sets) and the per-card extra (``--vram-headroom`` GB, fixed), has no room for all
of it.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import importlib.util
import logging
import os
import sys
import threading
import time
import traceback
import types
from typing import Any

from berth.decide.units import parse_size
from berth.sim.cards import SimCards, SimError, SimOOM

__all__ = ["run", "arguments", "LOADERS", "MODEL_EXTENSIONS"]

log = logging.getLogger("comfyui")

#: Loader nodes and the inputs that name a model file, with the folder each is looked up in
#: (ComfyUI's ``nodes.py`` at 0.3.64).
LOADERS: dict[str, dict[str, str]] = {
    "CheckpointLoaderSimple": {"ckpt_name": "checkpoints"},
    "CheckpointLoader": {"ckpt_name": "checkpoints"},
    "unCLIPCheckpointLoader": {"ckpt_name": "checkpoints"},
    "ImageOnlyCheckpointLoader": {"ckpt_name": "checkpoints"},
    "UNETLoader": {"unet_name": "diffusion_models"},
    "CLIPLoader": {"clip_name": "text_encoders"},
    "DualCLIPLoader": {"clip_name1": "text_encoders", "clip_name2": "text_encoders"},
    "TripleCLIPLoader": {"clip_name1": "text_encoders", "clip_name2": "text_encoders",
                         "clip_name3": "text_encoders"},
    "VAELoader": {"vae_name": "vae"},
    "LoraLoader": {"lora_name": "loras"},
    "LoraLoaderModelOnly": {"lora_name": "loras"},
    "ControlNetLoader": {"control_net_name": "controlnet"},
    "CLIPVisionLoader": {"clip_name": "clip_vision"},
    "StyleModelLoader": {"style_model_name": "style_models"},
    "UpscaleModelLoader": {"model_name": "upscale_models"},
}
MODEL_EXTENSIONS = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".gguf")
_SAMPLERS = ("KSampler", "KSamplerAdvanced", "SamplerCustom", "SamplerCustomAdvanced")
_PLAIN = ("EmptyLatentImage", "CLIPTextEncode", "VAEDecode", "VAEEncode", "SaveImage",
          "PreviewImage", "EmptyImage", *_SAMPLERS)
_GiB = 1 << 30


# -- folder_paths --------------------------------------------------------------------------
def _folder_paths(models_dir: str) -> types.ModuleType:
    m = types.ModuleType("folder_paths")
    m.models_dir = models_dir

    def get_full_path(folder_name: str, filename: str) -> str | None:
        path = os.path.join(models_dir, folder_name, filename)
        return path if os.path.isfile(path) else None

    def get_filename_list(folder_name: str) -> list[str]:
        d = os.path.join(models_dir, folder_name)
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    m.get_full_path, m.get_filename_list = get_full_path, get_filename_list
    m.folder_names_and_paths = {f: ([os.path.join(models_dir, f)], set(MODEL_EXTENSIONS))
                                for f in sorted({f for d in LOADERS.values() for f in d.values()})}
    return m


# -- the card: comfy.model_management ------------------------------------------------------
class Card:
    """This process's memory on one simulated card, as ComfyUI's model management keeps it."""

    def __init__(self, store: SimCards, pci: str, args: argparse.Namespace):
        self.store, self.pci, self.args = store, pci, args
        self.total_bytes = store.read(pci).spec.total_bytes
        self.lock = threading.RLock()
        self.loaded: dict[str, int] = {}      # model path -> bytes on the card, LRU order
        self.dynamic = not args.disable_dynamic_vram
        # comfy-aimdo's process-wide simple headroom (``--reserve-vram``, set through
        # ``comfy_aimdo.control`` and changeable while running) and the per-card extra fixed at
        # ``init_devices`` (``--vram-headroom``), added after it, as ComfyUI's main.py passes them.
        self.headroom_bytes = 0
        self.extra_headroom_bytes = int(args.vram_headroom * _GiB) if self.dynamic else 0
        self.nvml_pressure = False

    def free_bytes(self) -> int:
        return self.store.read(self.pci).free_bytes

    def load(self, path: str, size: int) -> int:
        """Bring the model at ``path`` (``size`` bytes) onto the card; returns bytes loaded.
        Raises :class:`SimOOM` when it does not fit (legacy loading)."""
        with self.lock:
            if path in self.loaded:
                self.loaded[path] = self.loaded.pop(path)       # most recently used
                return self.loaded[path]
            for old in list(self.loaded):                       # free_memory(): LRU first
                if self._room() >= size:
                    break
                self._unload(old)
            # Dynamic VRAM loads what fits and leaves the rest offloaded; legacy loading
            # allocates it whole (and fails with an OOM when the card has no room).
            n = max(0, min(size, self._room())) if self.dynamic else size
            self.store.alloc(self.pci, n)
            self.loaded[path] = n
            return n

    def _room(self) -> int:
        free = self.free_bytes()
        if not self.dynamic:
            return free
        return min(free, self.total_bytes - self.headroom_bytes - self.extra_headroom_bytes
                   - self.own_bytes())

    def _unload(self, path: str) -> int:
        n = self.loaded.pop(path)
        if n:
            self.store.free(self.pci, n)
        return n

    def own_bytes(self) -> int:
        return sum(self.loaded.values())

    def unload_all_models(self) -> None:
        """Free every model, unless the GPU is the offload device (``--highvram``,
        ``--gpu-only``): then the models stay where they are."""
        with self.lock:
            if self.args.highvram or self.args.gpu_only:
                log.info("unload_all_models: the offload device is the GPU (--highvram/--gpu-only); "
                         "nothing leaves the card")
                return
            for path in list(self.loaded):
                self._unload(path)


def _modules(card: Card, args: argparse.Namespace, models_dir: str) -> dict[str, types.ModuleType]:
    comfy = types.ModuleType("comfy")
    comfy.__path__ = []
    cli_args = types.ModuleType("comfy.cli_args")
    cli_args.args = args
    mm = types.ModuleType("comfy.model_management")
    mm.current_loaded_models = card.loaded            # a mapping here; ComfyUI keeps a list
    mm.unload_all_models = card.unload_all_models
    mm.soft_empty_cache = lambda *a, **k: None
    mm.get_torch_device = lambda: f"cuda:0 ({card.pci})"
    mm.get_total_memory = lambda dev=None, torch_total_too=False: \
        (card.total_bytes, card.total_bytes) if torch_total_too else card.total_bytes
    mm.EXTRA_RESERVED_VRAM = int(args.reserve_vram * _GiB) if args.reserve_vram else 400 << 20
    mem = types.ModuleType("comfy.memory_management")
    mem.aimdo_enabled = card.dynamic
    comfy.cli_args, comfy.model_management, comfy.memory_management = cli_args, mm, mem
    mods = {"comfy": comfy, "comfy.cli_args": cli_args, "comfy.model_management": mm,
            "comfy.memory_management": mem, "folder_paths": _folder_paths(models_dir)}
    if card.dynamic:
        mods.update(_aimdo(card))
    return mods


def _aimdo(card: Card) -> dict[str, types.ModuleType]:
    """``comfy_aimdo.control`` as comfy-aimdo 0.5.3 and later offer it (the releases' own
    ``control.py``): ``init(implementation, simple_vram_headroom, nvml_pressure)`` (on a loaded
    library it sets the headroom when given, and NVML pressure always: to its default, off,
    when not given), ``set_simple_vram_headroom``/``get_simple_vram_headroom`` and the native
    ``lib`` behind them."""
    aimdo = types.ModuleType("comfy_aimdo")
    aimdo.__path__ = []
    control = types.ModuleType("comfy_aimdo.control")

    def set_headroom(n: int) -> None:
        card.headroom_bytes = int(n)
        log.info("aimdo: simple VRAM headroom set to %d MiB", int(n) >> 20)

    def set_nvml_pressure(on: bool) -> None:
        card.nvml_pressure = bool(on)
        log.info("aimdo: NVML pressure %s", "on" if on else "off")

    control.lib = types.SimpleNamespace(set_simple_vram_headroom=set_headroom,
                                        get_simple_vram_headroom=lambda: card.headroom_bytes,
                                        set_nvml_pressure=set_nvml_pressure)

    def init(implementation=None, simple_vram_headroom=None, nvml_pressure=False) -> bool:
        if simple_vram_headroom is not None:
            set_headroom(simple_vram_headroom)
        set_nvml_pressure(nvml_pressure)
        return True

    def set_simple_vram_headroom(n: int) -> None:
        if int(n) < 0 or int(n) > (1 << 60):
            raise ValueError("simple_vram_headroom must be between 0 and 2**60 bytes")
        set_headroom(n)

    control.init, control.set_simple_vram_headroom = init, set_simple_vram_headroom
    control.get_simple_vram_headroom = lambda: card.headroom_bytes
    aimdo.control = control
    return {"comfy_aimdo": aimdo, "comfy_aimdo.control": control}


# -- execution.PromptQueue -----------------------------------------------------------------
class PromptQueue:
    """ComfyUI's prompt queue: a heap of ``(number, prompt_id, prompt, extra_data, outputs)``,
    the running items, the history and the flags the worker applies between prompts."""

    def __init__(self, server):
        self.server = server
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)
        self.task_counter = 0
        self.queue: list = []
        self.currently_running: dict[int, Any] = {}
        self.history: dict[str, dict] = {}
        self.flags: dict[str, Any] = {}

    def put(self, item) -> None:
        with self.mutex:
            heapq.heappush(self.queue, item)
            self.server.queue_updated()
            self.not_empty.notify()

    def get(self, timeout=None):
        with self.not_empty:
            while len(self.queue) == 0:
                self.not_empty.wait(timeout=timeout)
                if timeout is not None and len(self.queue) == 0:
                    return None
            item = heapq.heappop(self.queue)
            i = self.task_counter
            self.currently_running[i] = item
            self.task_counter += 1
            return item, i

    def task_done(self, item_id, history_result: dict, status: dict) -> None:
        with self.mutex:
            prompt = self.currently_running.pop(item_id)
            self.history[prompt[1]] = {"prompt": prompt, "outputs": {}, "status": status,
                                       **history_result}
            self.server.queue_updated()

    def get_current_queue(self):
        with self.mutex:
            return list(self.currently_running.values()), list(self.queue)

    def get_tasks_remaining(self) -> int:
        with self.mutex:
            return len(self.queue) + len(self.currently_running)

    def wipe_queue(self) -> None:
        with self.mutex:
            self.queue = []
            self.server.queue_updated()

    def delete_queue_item(self, function) -> bool:
        """Remove the first pending item ``function(item)`` is true for (execution.py)."""
        with self.mutex:
            for x in range(len(self.queue)):
                if function(self.queue[x]):
                    if len(self.queue) == 1:
                        self.wipe_queue()
                    else:
                        self.queue.pop(x)
                        heapq.heapify(self.queue)
                    self.server.queue_updated()
                    return True
        return False

    def set_flag(self, name: str, data) -> None:
        with self.mutex:
            self.flags[name] = data
            self.not_empty.notify()

    def get_flags(self, reset: bool = True) -> dict:
        with self.mutex:
            if reset:
                ret, self.flags = self.flags, {}
                return ret
            return self.flags.copy()


# -- nodes ---------------------------------------------------------------------------------
NODE_CLASS_MAPPINGS: dict[str, Any] = {name: None for name in (*LOADERS, *_PLAIN)}
_interrupt = threading.Event()


def interrupt_processing(value: bool = True) -> None:
    (_interrupt.set if value else _interrupt.clear)()


async def load_custom_node(module_path: str) -> bool:
    """Import a custom node package from its file path, registered under a name derived from
    the path (``nodes.py``); its ``NODE_CLASS_MAPPINGS`` join the known nodes. An exception is
    logged and the package skipped, as ComfyUI does."""
    sys_module_name = module_path.replace(".", "_x_")
    try:
        spec = importlib.util.spec_from_file_location(sys_module_name,
                                                      os.path.join(module_path, "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[sys_module_name] = module
        spec.loader.exec_module(module)
        mappings = getattr(module, "NODE_CLASS_MAPPINGS", None)
        if mappings is None:
            log.warning("Skip %s module for custom nodes due to the lack of NODE_CLASS_MAPPINGS",
                        module_path)
            return False
        NODE_CLASS_MAPPINGS.update(mappings)
        return True
    except Exception:
        log.warning(traceback.format_exc())
        log.warning("Cannot import %s module for custom nodes", module_path)
        print(f"IMPORT FAILED: {module_path}", flush=True)
        return False


# -- main.prompt_worker --------------------------------------------------------------------
def _execute(server, prompt: dict, args: argparse.Namespace) -> tuple[bool, list[str]]:
    card, fp = server.card, sys.modules["folder_paths"]
    for nid in sorted(prompt, key=lambda k: (len(k), k)):
        node = prompt[nid]
        cls, inputs = node["class_type"], node.get("inputs") or {}
        for inp, folder in LOADERS.get(cls, {}).items():
            path = fp.get_full_path(folder, inputs[inp])
            try:
                card.load(path, os.path.getsize(path))
            except SimOOM as e:
                return False, [f"node {nid} ({cls}): torch.OutOfMemoryError: {e}"]
        if cls in _SAMPLERS:
            steps = int(inputs.get("steps", 4))
            act = parse_size(args.activation, field="--activation")
            try:
                card.store.alloc(card.pci, act)
            except SimOOM as e:
                return False, [f"node {nid} ({cls}): torch.OutOfMemoryError: {e}"]
            try:
                for _ in range(steps):
                    if _interrupt.is_set():
                        _interrupt.clear()
                        return False, ["interrupted"]
                    time.sleep(args.step_s)
            finally:
                card.store.free(card.pci, act)
        custom = NODE_CLASS_MAPPINGS.get(cls)
        if custom is not None:
            getattr(custom(), custom.FUNCTION)(**inputs)
    return True, []


def prompt_worker(q: PromptQueue, server, args: argparse.Namespace) -> None:
    # As ComfyUI's: after a prompt (or an unload) it collects garbage and empties the cache at
    # most every 10 s, for ``--gc-s`` here. It waits on the queue only between those steps, and
    # PromptQueue.get looks at no flag: a flag set meanwhile wakes nothing until the next
    # set_flag or prompt (seen against ComfyUI 0.3.64: a park set its flags during that step).
    last_gc, need_gc, interval = 0.0, False, 10.0
    while True:
        timeout = 1000.0
        if need_gc:
            timeout = max(interval - (time.perf_counter() - last_gc), 0.0)
        item = q.get(timeout=timeout)
        if item is not None:
            (number, prompt_id, prompt, extra, _), item_id = item
            t = time.perf_counter()
            try:
                ok, messages = _execute(server, prompt, args)
            except Exception as e:                      # a node failed: the prompt errors
                ok, messages = False, [f"{type(e).__name__}: {e}"]
            need_gc = True
            q.task_done(item_id, {}, {"status_str": "success" if ok else "error",
                                      "completed": ok, "messages": messages})
            log.info("Prompt executed in %.2f seconds%s", time.perf_counter() - t,
                     "" if ok else f" with an error: {messages}")
        flags = q.get_flags()
        free_memory = flags.get("free_memory", False)
        if flags.get("unload_models", free_memory):
            server.card.unload_all_models()
            need_gc, last_gc = True, 0.0
        if need_gc and time.perf_counter() - last_gc > interval:
            time.sleep(args.gc_s)                       # gc.collect(); soft_empty_cache()
            last_gc, need_gc = time.perf_counter(), False


# -- main ----------------------------------------------------------------------------------
def arguments(p: argparse.ArgumentParser) -> None:
    """``berth sim comfyui`` flags (ComfyUI's own names where it has one)."""
    p.add_argument("--port", type=int, default=8188)
    p.add_argument("--listen", default="127.0.0.1")
    p.add_argument("--models", required=True, metavar="DIR",
                   help="models directory (checkpoints/, diffusion_models/, vae/ ...)")
    p.add_argument("--custom-node", action="append", default=[], metavar="PATH",
                   help="a custom node package directory to load at startup (repeatable)")
    p.add_argument("--card", help="simulated card (default: $CUDA_VISIBLE_DEVICES' first, "
                                  "else the first card)")
    p.add_argument("--residual", default="300MiB", help="the CUDA context (default 300MiB)")
    p.add_argument("--activation", default="512MiB",
                   help="memory a sampler uses while it runs (default 512MiB)")
    p.add_argument("--step-s", type=float, default=0.05, help="seconds per sampler step")
    p.add_argument("--gc-s", type=float, default=0.2,
                   help="seconds of the worker's gc and cache emptying after a prompt (0.2)")
    vram = p.add_mutually_exclusive_group()      # as in ComfyUI's cli_args.py
    vram.add_argument("--highvram", action="store_true")
    vram.add_argument("--gpu-only", action="store_true")
    vram.add_argument("--cpu", action="store_true")
    p.add_argument("--disable-dynamic-vram", action="store_true")
    p.add_argument("--disable-nvml-pressure", action="store_true")
    p.add_argument("--vram-headroom", type=float, default=0.0, metavar="GB",
                   help="dynamic VRAM: a per-card extra headroom, fixed at start")
    p.add_argument("--reserve-vram", type=float, default=None, metavar="GB",
                   help="dynamic VRAM: the simple headroom (what Berth's node changes); "
                        "legacy loading: ComfyUI's extra reserved VRAM")
    p.add_argument("--dir", help="simulated cards directory (default $BERTH_SIM_DIR)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        store = SimCards(args.dir)
        key = args.card or (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0] or "0"
        pci = store.resolve(key).pci
        card = Card(store, pci, args)
        store.alloc(pci, parse_size(args.residual, field="--residual"))
    except (SimError, SimOOM, ValueError) as e:
        print(f"berth sim comfyui: {e}", file=sys.stderr)
        return 2
    sys.modules.update(_modules(card, args, os.path.abspath(args.models)))
    if card.dynamic:                # main.py, before torch: comfy_aimdo.control.init(...)
        sys.modules["comfy_aimdo.control"].init(
            simple_vram_headroom=None if args.reserve_vram is None
            else int(args.reserve_vram * _GiB), nvml_pressure=not args.disable_nvml_pressure)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    from berth.sim import comfyui_server
    this = sys.modules[__name__]
    sys.modules.update({"server": comfyui_server, "execution": this, "nodes": this})
    server = comfyui_server.PromptServer(loop, card, PromptQueue)

    async def init_extra_nodes():
        for path in args.custom_node:
            t = time.perf_counter()
            ok = await load_custom_node(os.path.abspath(path))
            print(f"{time.perf_counter() - t:6.1f} seconds{'' if ok else ' (IMPORT FAILED)'}: "
                  f"{path}", flush=True)

    loop.run_until_complete(init_extra_nodes())
    server.add_routes()
    threading.Thread(target=prompt_worker, args=(server.prompt_queue, server, args),
                     daemon=True).start()
    import signal
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    try:
        loop.run_until_complete(server.start(args.listen, args.port))
        publish = loop.create_task(server.publish_loop())   # main.py gathers it with start
        loop.run_forever()
        publish.cancel()
    except KeyboardInterrupt:
        pass
    finally:
        store.release()
    return 0
