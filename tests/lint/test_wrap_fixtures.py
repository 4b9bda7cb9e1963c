"""`rewrite --wrap` on scripts shaped like real ones (tests/lint/fixtures/wrap/): what is
inserted, where, or why the script is declined."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from autoopt.lint.wrap.insert import wrap_source

FIXTURES = Path(__file__).parent / "fixtures" / "wrap"


def insertions(old: str, new: str) -> list[tuple[str, str]]:
    """(line before, inserted line) for each line `new` adds to `old`; nothing is removed."""
    out: list[tuple[str, str]] = []
    before = ""
    for line in difflib.ndiff(old.splitlines(), new.splitlines()):
        assert not line.startswith("- "), f"a line was removed: {line}"
        if line.startswith("+ "):
            out.append((before.strip(), line[2:]))
        elif line.startswith("  "):
            before = line[2:]
    return out


IMPORT = "import autoopt"

WRAPPED = {
    # an ignite Engine running the script's own step: the loader it is run on is the loop's
    "ignite_engine.py": [
        ("from ignite.engine import Engine", IMPORT),
        (
            ")",  # after the loader's statement
            "    model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            'device="cpu")',
        ),
    ],
    # the loader held by an object of the agent: the call assigns that attribute
    "held_loader.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)",
            "        self.model, self.data_loader.train_loader, self.optimizer = autoopt.optimize("
            'self.model, self.data_loader.train_loader, self.optimizer, device="cpu")',
        ),
    ],
    # a module global rebound from main(): declared global first; the perturbation's
    # optimizer (over a tensor) gets no call
    "global_loader_attack.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        ("def main():", "    global train_loader"),
        (
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.05)",
            "    model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
            'device="cpu")',
        ),
    ],
    # SAC's temperature: an Adam over a bare tensor (`[self.log_alpha]`) gets no call
    "sac_temperature.py": [
        ("import torch.nn.functional as F", IMPORT),
        (
            "self.policy_optimizer = torch.optim.Adam(self.policy_net.parameters(), lr=1e-3)",
            "        self.q_net, self.q_optimizer = autoopt.optimize(self.q_net, "
            'optimizer=self.q_optimizer, device="cpu")',
        ),
        (
            "self.policy_optimizer = torch.optim.Adam(self.policy_net.parameters(), lr=1e-3)",
            "        self.policy_net, self.policy_optimizer = autoopt.optimize(self.policy_net, "
            'optimizer=self.policy_optimizer, device="cpu")',
        ),
    ],
    # one optimizer over a list grown with `+=` from two models, the second optional (nerf):
    # a call per model, the optional one under `if ... is not None`
    "optional_second_model.py": [
        ("import torch.nn.functional as F", IMPORT),
        (
            "optimizer = torch.optim.Adam(trainable_parameters, lr=1e-2)",
            '    model_coarse = autoopt.optimize(model_coarse, device=device, amp="script")'
            '  # autoopt: amp="script" (an optimizer spans several models)',
        ),
        (
            "optimizer = torch.optim.Adam(trainable_parameters, lr=1e-2)",
            "    if model_fine is not None: model_fine = autoopt.optimize(model_fine, "
            'device=device if USE_FINE else "cpu", amp="script")'
            '  # autoopt: amp="script" (an optimizer spans several models)',
        ),
    ],
    # a ModuleList that only gathers parameters: the call gets the model it holds
    "module_list_holder.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "train_loader = DataLoader(torch.randn(32, 4), batch_size=8)",
            "cnn, train_loader, optimizer = autoopt.optimize(cnn, train_loader, optimizer, "
            'device="cpu")',
        ),
    ],
    # an EMA of the weights stepped beside the optimizer is no optimizer: one call, the model's
    "ema_weights.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(torch.randn(32, 4), batch_size=8)",
            'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cpu")',
        ),
    ],
    "main_train_split.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "train_loader = DataLoader(data, batch_size=16)",
            "    model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
            'device="cpu")',
        ),
    ],
    "factory_optimizer.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(list(torch.randn(32, 8)), batch_size=8)",
            'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cpu", '
            'amp="script")  # autoopt: amp="script" (own autocast/GradScaler)',
        ),
    ],
    "optimizer_choice.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(torch.randn(16, 4), batch_size=4)",
            'net, loader, opt = autoopt.optimize(net, loader, opt, device="cpu")',
        ),
    ],
    "gan.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "dataloader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16)",
            "generator, dataloader, optimizer_G = autoopt.optimize(generator, dataloader, "
            'optimizer_G, device="cpu")',
        ),
        (
            "dataloader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16)",
            "discriminator, optimizer_D = autoopt.optimize(discriminator, optimizer=optimizer_D, "
            'device="cpu")',
        ),
    ],
    "helper_module/train.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "data_loader = DataLoader(data, batch_size=12)",
            "    model, data_loader, optimizer = autoopt.optimize(model, data_loader, optimizer, "
            'device="cpu")',
        ),
    ],
    "get_batch.py": [
        ("import torch", IMPORT),
        (
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)",
            'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cpu")',
        ),
    ],
    "trainer_class.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "train_data = DataLoader(dataset, batch_size=8)",
            "    model, train_data, optimizer = autoopt.optimize(model, train_data, optimizer, "
            'device="cpu")',
        ),
    ],
    "own_amp.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(torch.randn(32, 8), batch_size=8)",
            'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cpu", '
            'amp="script")  # autoopt: amp="script" (own autocast/GradScaler)',
        ),
    ],
    "own_ddp.py": [
        ("from torch.nn.parallel import DistributedDataParallel as DDP", IMPORT),
        (
            "loader = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=8)",
            "    model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            'device="cpu", distributed=False)'
            "  # autoopt: distributed=False (own DDP/FSDP/DataParallel wrap)",
        ),
    ],
    "compiled.py": [
        ("import torch", IMPORT),
        (
            "loader = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=8)",
            "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            'device="cpu", compile=False)'
            "  # autoopt: compile=False (own torch.compile)",
        ),
    ],
    # a training run per seed (GraphMAE): the call inside the seed loop; the linear probe's
    # optimizer in an evaluation function is no second place for it
    "run_per_seed.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)",
            '        model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cpu")',
        ),
    ],
    # the model placed after its optimizer, once the device is picked (nanoVLM): the call goes
    # after that placement
    "placed_after_optimizer.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "model.to(device)",
            "    model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            "device=device)",
        ),
    ],
    "mnist_device.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)",
            "    model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
            "device=device)",
        ),
    ],
    "config_device.py": [
        ("import torch", IMPORT),
        (
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)",
            "model, optimizer = autoopt.optimize(model, optimizer=optimizer, device=device)",
        ),
    ],
    "args_device.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(torch.randn(48, 8), batch_size=16)",
            "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            "device=args.device)",
        ),
    ],
    "iter_next.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "train_loader = DataLoader(self.dataset, batch_size=8, shuffle=True)",
            "        model, train_loader, self.optimizer = autoopt.optimize(model, train_loader, "
            'self.optimizer, device="cpu")',
        ),
    ],
    "shared_optimizer.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        *[
            (
                "dataloader = DataLoader(TensorDataset(torch.randn(48, 8), torch.randn(48, 8)), "
                "batch_size=16)",
                line + '  # autoopt: amp="script" (an optimizer spans several models)',
            )
            for line in (
                "D_A, dataloader, optimizer_D_A = autoopt.optimize(D_A, dataloader, "
                'optimizer_D_A, device="cpu", amp="script")',
                'G_AB = autoopt.optimize(G_AB, device="cpu", amp="script")',
                'G_BA = autoopt.optimize(G_BA, device="cpu", amp="script")',
            )
        ],
    ],
    # The loop iterates a progress bar over step numbers; batches come from a generator that
    # captured the loader before the optimizer: the call goes without a loader.
    "step_progress_bar.py": [
        ("from tqdm import trange", IMPORT),
        (
            "optim = torch.optim.Adam(net_model.parameters(), lr=1e-3)",
            '    net_model, optim = autoopt.optimize(net_model, optimizer=optim, device="cpu")',
        ),
    ],
    "cycle_loader.py": [
        ("from torch.utils.data import DataLoader", IMPORT),
        (
            "loader = DataLoader(torch.randn(32, 8), batch_size=8)",
            'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cpu")',
        ),
    ],
    "cpu_only.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "loader = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=8)",
            'net, loader, optimizer = autoopt.optimize(net, loader, optimizer, device="cpu")',
        ),
    ],
    "lbfgs_closure.py": [
        ("import torch", IMPORT),
        (
            "optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.5)",
            'seq, optimizer = autoopt.optimize(seq, optimizer=optimizer, device="cpu", amp="script")'
            '  # autoopt: amp="script" (the optimizer steps through a closure: loss scaling cannot '
            "check it first)",
        ),
    ],
    "apex_amp.py": [
        ("from apex import amp", IMPORT),
        (
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.05)",
            'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cuda", '
            'amp="script", compile=False)  # autoopt: amp="script" (own apex amp), compile=False (apex '
            "amp casts and patches the model after the call)",
        ),
    ],
    "gpu_flag.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "loader = DataLoader(TensorDataset(torch.randn(24, 4), torch.randint(0, 2, (24,))), "
            "batch_size=8)",
            "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            'device="cuda" if args.gpu else "cpu")',
        ),
    ],
    "optimizer_list.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "loader = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=8)",
            'encoder, loader, opt_enc = autoopt.optimize(encoder, loader, opt_enc, device="cpu")',
        ),
        (
            "loader = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=8)",
            'decoder, opt_dec = autoopt.optimize(decoder, optimizer=opt_dec, device="cpu")',
        ),
    ],
    # The backward and step sit in a function nested in the epoch function (timm's `_backward`).
    "nested_backward.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), "
            "batch_size=8)",
            "    model, loader, optimizer = autoopt.optimize(model, loader, optimizer, "
            'device="cpu")',
        ),
    ],
    # The factory of a local module places the model behind the script's flag.
    "factory_gpu_flag/train.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "optimizer = torch.optim.SGD(net.parameters(), lr=0.1)",
            "    net, loader, optimizer = autoopt.optimize(net, loader, optimizer, "
            'device="cuda" if args.gpu else "cpu")',
        ),
    ],
    # The Trainer the model is handed to places it on the process's GPU.
    "trainer_places_model.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "train_data = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), "
            "batch_size=8)",
            "    model, train_data, optimizer = autoopt.optimize(model, train_data, optimizer, "
            'device=int(os.environ["LOCAL_RANK"]))',
        ),
    ],
    "step_helper.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        (
            "self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)",
            "        self.model, self.loader, self.optimizer = autoopt.optimize(self.model, "
            'self.loader, self.optimizer, device="cpu")',
        ),
    ],
    "restored_optimizer.py": [
        ("from torch.utils.data import DataLoader, TensorDataset", IMPORT),
        *[
            ("loader = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=8)", line)
            for line in (
                'decoder, loader = autoopt.optimize(decoder, loader, device="cpu", amp="script")'
                '  # autoopt: amp="script" (an optimizer spans several models)',
                'encoder = autoopt.optimize(encoder, device="cpu", amp="script")'
                '  # autoopt: amp="script" (an optimizer spans several models)',
            )
        ],
    ],
}

DECLINED = {
    "hf_trainer.py": ("already uses the transformers Trainer", "transformers Trainer"),
    "tensor_optimizer.py": ("optimizer over tensors, not a model", "steps a list of tensors"),
    "fp16_master_weights.py": ("another mixed-precision system", "fp32 master weights"),
    "model_in_wrapper.py": (
        "model trained through another object",
        "the loop trains `net_model` through `trainer`",
    ),
    "trainer_runs_global.py": (
        "model trained as a global",
        "Trainer.__init__() keeps `model` as `self.model`, but the loop runs the module's global",
    ),
    "accelerate_script.py": ("already uses Accelerate", "accelerator.prepare"),
    "hogwild.py": ("Hogwild", "shared memory"),
    "ddp_before_optimizer.py": (
        "model wrapped in DDP/FSDP before the optimizer",
        "optimize() must get the bare model",
    ),
    # Asked before "which model's parameters feed the optimizer" (groups built in a loop).
    "ddp_param_groups.py": (
        "model wrapped in DDP/FSDP before the optimizer",
        "optimize() must get the bare model",
    ),
    "kwargs_trainer_module.py": (
        "optimizer created in another module",
        "the keyword argument `optimizer` of Trainer(), which nothing here calls",
    ),
    "scheduled_optim.py": (
        "optimizer wrapped in a class",
        "`optimizer` is an instance of ScheduledOptim, a wrapper class that steps the torch "
        "optimizer it holds in step_and_update_lr()",
    ),
    "ignite_supervised.py": ("already uses ignite", "ignite Engine"),
    "ignite_distributed.py": ("already uses ignite", "`idist.auto_model(torch.nn.Linear(8, 1))`"),
    "library_loss_scaler.py": (
        "another mixed-precision system",
        "its loss scaler does the backward and steps the optimizer (`loss_scaler(...)`",
    ),
}


def wrap_fixture(name: str):
    path = FIXTURES / name
    return path.read_text(), wrap_source(path.read_text(), path=path)


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_inserts_the_call_where_the_objects_exist(name: str) -> None:
    source, result = wrap_fixture(name)
    assert not result.declined, result.message
    assert insertions(source, result.source) == WRAPPED[name]
    cst.parse_module(result.source)
    # Idempotent: a second run changes nothing.
    again = wrap_source(result.source, path=FIXTURES / name)
    assert not again.changed and again.message == "already calls autoopt.optimize()"


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_declines_scripts_that_already_do_it_their_way(name: str) -> None:
    source, result = wrap_fixture(name)
    reason, detail = DECLINED[name]
    assert result.declined and result.source == source
    assert result.reason == reason
    assert detail in result.message


DATAPARALLEL_EDIT = (
    "optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)\n",
    "net = torch.nn.DataParallel(net)\n",
)


def parallel_edit(source: str) -> str:
    """The edit the DataParallel decline names: the optimizer created above the wrap."""
    optimizer, wrap = DATAPARALLEL_EDIT
    return source.replace(optimizer, "").replace(wrap, optimizer + wrap)


def test_a_parallel_wrap_before_the_optimizer_is_declined_with_the_edit_that_wraps() -> None:
    """pytorch-cifar, imagenet: the decline quotes the wrap and says where the optimizer goes;
    after that edit the call goes between them, leaving the DataParallel to the script."""
    source, result = wrap_fixture("dataparallel_first.py")
    assert result.declined and result.reason == "model wrapped in DDP/FSDP before the optimizer"
    assert "`net = torch.nn.DataParallel(net)` wraps the model in DataParallel before" in (
        result.message
    )
    assert "create the optimizer above that line" in result.message
    edited = wrap_source(parallel_edit(source), path=FIXTURES / "dataparallel_first.py")
    assert edited.inserted == (
        "net, trainloader, optimizer = autoopt.optimize(net, trainloader, optimizer, "
        "device=device, distributed=False)  # autoopt: distributed=False (own "
        "DDP/FSDP/DataParallel wrap)",
    )
    assert edited.source.index("autoopt.optimize(") < edited.source.index("DataParallel(net)")


def test_the_loop_in_a_local_module_is_found_only_through_that_module(tmp_path: Path) -> None:
    """Without engine.py beside it, the script reaches no backward: the helper was what
    counted, and the decline names the call its optimizer goes to."""
    script = (FIXTURES / "helper_module" / "train.py").read_text()
    (tmp_path / "train.py").write_text(script)
    result = wrap_source(script, path=tmp_path / "train.py")
    assert result.declined and result.reason == "training loop in code --wrap cannot read"
    assert "is handed to `train_one_epoch(...)`" in result.message


def test_a_helper_called_after_training_is_no_placement(tmp_path: Path) -> None:
    """A function the model is handed to after training (`export(model)` moving it to the GPU
    to time inference) says nothing about the training device: no `device=` from it."""
    script = (FIXTURES / "trainer_places_model.py").read_text()
    script = script.replace(
        "    trainer.train(2)\n",
        "    trainer.train(2)\n    export(model)\n",
    ).replace(
        "def main():",
        'def export(model):\n    model.to("cuda")\n    torch.save(model.state_dict(), "m.pt")\n\n\n'
        "def main():",
    )
    # The Trainer (before training) still places it; without it, the export alone does not.
    result = wrap_source(script, path=tmp_path / "train.py")
    assert 'device=int(os.environ["LOCAL_RANK"])' in result.source
    alone = script.replace(
        "        self.model = model.to(self.gpu_id)\n", "        self.model = model\n"
    )
    result = wrap_source(alone, path=tmp_path / "train.py")
    assert result.inserted and "device=" not in result.inserted[0], result.inserted


def test_the_global_declaration_goes_below_the_docstring() -> None:
    """`global train_loader` is the function's first statement after its docstring (above
    the docstring it would turn the docstring into a plain expression)."""
    source = textwrap.dedent(
        '''
        import torch
        from torch.utils.data import DataLoader

        train_loader = DataLoader(list(torch.randn(8, 4)), batch_size=4)


        def train(model, loader, optimizer):
            for x in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()


        def main():
            """Build the model and train it."""
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            train(model, train_loader, optimizer)
        '''
    )
    result = wrap_source(source)
    assert not result.declined, result.message
    body = result.source.split("def main():\n", 1)[1].splitlines()
    assert body[0].strip() == '"""Build the model and train it."""'
    assert body[1].strip() == "global train_loader"
    compile(result.source, "<wrapped>", "exec")


def test_an_attribute_of_a_held_object_that_is_no_loader_is_left_out() -> None:
    """ClusterGCN iterates `self.clustering_machine.clusters` (cluster ids): no loader in the
    call, unlike `self.data_loader.train_loader`."""
    source = textwrap.dedent(
        """
        import torch

        class Trainer:
            def __init__(self, machine):
                self.clustering_machine = machine
                self.model = torch.nn.Linear(4, 1)
                self.optimizer = torch.optim.Adam(self.model.parameters())

            def train(self):
                for cluster in self.clustering_machine.clusters:
                    self.optimizer.zero_grad()
                    self.model(self.clustering_machine.features[cluster]).sum().backward()
                    self.optimizer.step()
        """
    )
    result = wrap_source(source)
    assert result.inserted == (
        "self.model, self.optimizer = autoopt.optimize(self.model, optimizer=self.optimizer, "
        'device="cpu")',
    ), result.message


def test_the_several_optimizers_decline_names_each_and_its_module(tmp_path: Path) -> None:
    """SimSiam: main() trains, then runs linear_eval.main(), which builds its own optimizer."""
    (tmp_path / "linear_eval.py").write_text(
        textwrap.dedent(
            """
            import torch

            def main(model, loader):
                classifier = torch.nn.Linear(4, 2)
                optimizer = torch.optim.SGD(classifier.parameters(), lr=0.1)
                for x in loader:
                    optimizer.zero_grad()
                    classifier(model(x)).sum().backward()
                    optimizer.step()
            """
        )
    )
    script = tmp_path / "main.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            import linear_eval

            def main(loader):
                model = torch.nn.Linear(4, 4)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
                linear_eval.main(model, loader)
            """
        )
    )
    result = wrap_source(script.read_text(), path=script)
    assert result.declined
    assert "`optimizer` in main(), `optimizer` in main() of linear_eval.py" in result.message


def wrap_beside(tmp_path: Path, modules: dict[str, str], name: str, script: str):
    """`--wrap` on `script` (written as `name`) with the local `modules` beside it."""
    for module, text in modules.items():
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(textwrap.dedent(text))
    script = textwrap.dedent(script)
    (tmp_path / name).write_text(script)
    return wrap_source(script, path=tmp_path / name)


def test_an_optimizer_a_trainer_class_creates_names_its_method_and_module(tmp_path: Path) -> None:
    """SimGNN: main.py builds `SimGNNTrainer(args)` and calls `fit()`, which creates the Adam and
    runs the loop in simgnn.py: the decline names the method and its module."""
    result = wrap_beside(
        tmp_path,
        {
            "simgnn.py": """
            import torch

            class SimGNNTrainer:
                def __init__(self, args):
                    self.model = torch.nn.Linear(4, 1)

                def fit(self, batches):
                    self.optimizer = torch.optim.Adam(self.model.parameters())
                    for x in batches:
                        self.optimizer.zero_grad()
                        self.model(x).sum().backward()
                        self.optimizer.step()
            """,
        },
        "main.py",
        "from simgnn import SimGNNTrainer\n\ntrainer = SimGNNTrainer(None)\ntrainer.fit([])\n",
    )
    assert result.declined and result.reason == "optimizer created in another module"
    assert "created in SimGNNTrainer.fit() of " in result.message
    assert "simgnn.py, which this script runs" in result.message


def test_a_trainer_class_under_another_name_is_followed(tmp_path: Path) -> None:
    """PatchTST: `Exp = Exp_Main` in the `__main__` block, then `exp = Exp(args)` and
    `exp.train(setting)`: the decline names Exp_Main's method and module."""
    trainer = """
    import torch

    class Exp_Main:
        def __init__(self, args):
            self.model = torch.nn.Linear(4, 1)

        def train(self, setting):
            optimizer = torch.optim.Adam(self.model.parameters())
            for x in []:
                optimizer.zero_grad()
                self.model(x).sum().backward()
                optimizer.step()
    """
    script = """
    from exp_main import Exp_Main

    if __name__ == "__main__":
        Exp = Exp_Main
        exp = Exp(None)
        exp.train("setting")
    """
    result = wrap_beside(tmp_path, {"exp_main.py": trainer}, "run.py", script)
    assert result.declined and result.reason == "optimizer created in another module"
    assert "created in Exp_Main.train() of " in result.message


def test_an_agent_of_a_local_module_that_creates_its_optimizers_is_named(tmp_path: Path) -> None:
    """BCQ: main.py builds `policy = BCQ.BCQ(...)` (after `import BCQ`) and calls its train();
    the networks and their Adams are created in `BCQ.__init__`: the decline says where."""
    result = wrap_beside(
        tmp_path,
        {
            "BCQ.py": """
            import torch

            class BCQ:
                def __init__(self, device):
                    self.actor = torch.nn.Linear(4, 1).to(device)
                    self.actor_optimizer = torch.optim.Adam(self.actor.parameters())

                def train(self, buffer):
                    for x in buffer:
                        self.actor_optimizer.zero_grad()
                        self.actor(x).sum().backward()
                        self.actor_optimizer.step()
            """,
        },
        "main.py",
        "import BCQ\n\npolicy = BCQ.BCQ('cpu')\nfor it in range(3):\n    policy.train([])\n",
    )
    assert result.declined and result.reason == "optimizer created in another module"
    assert "created in BCQ.__init__() of " in result.message
    # the backward is reached through the agent's own train(): the class is where --wrap goes
    assert (
        "BCQ.__init__() of" in result.message and "BCQ.py, which this script runs" in result.message
    )


def test_a_model_built_through_a_registry_names_the_registered_classes(tmp_path: Path) -> None:
    """BasicSR: `model = build_model(opt)` returns `MODEL_REGISTRY.get(opt["model_type"])(opt)`,
    whose classes register themselves in modules imported by a folder scan; the registered
    class creates the optimizer and trains in `optimize_parameters`: the decline names it."""
    result = wrap_beside(
        tmp_path,
        {
            "registry.py": """
            class Registry:
                def __init__(self):
                    self._classes = {}

                def register(self):
                    def add(cls):
                        self._classes[cls.__name__] = cls
                        return cls
                    return add

                def get(self, name):
                    return self._classes[name]

            MODEL_REGISTRY = Registry()
            """,
            "models/__init__.py": """
            from registry import MODEL_REGISTRY

            def build_model(opt):
                model = MODEL_REGISTRY.get(opt["model_type"])(opt)
                return model
            """,
            "models/sr_model.py": """
            import torch
            from registry import MODEL_REGISTRY

            @MODEL_REGISTRY.register()
            class SRModel:
                def __init__(self, opt):
                    self.net = torch.nn.Linear(4, 4)
                    self.setup_optimizers()

                def setup_optimizers(self):
                    self.optimizer = torch.optim.Adam(self.net.parameters())

                def optimize_parameters(self, x):
                    self.optimizer.zero_grad()
                    self.net(x).sum().backward()
                    self.optimizer.step()
            """,
        },
        "train.py",
        """
        import torch
        from models import build_model

        model = build_model({"model_type": "SRModel"})
        for step in range(3):
            model.optimize_parameters(torch.randn(2, 4))
        """,
    )
    assert result.declined and result.reason == "optimizer created in another module"
    assert "SRModel.setup_optimizers() of " in result.message


def test_a_class_picked_by_a_factory_names_the_base_class_that_trains(tmp_path: Path) -> None:
    """TALENT: `get_method(name)(args)` returns one of several classes, each imported in its
    own branch; they inherit `fit` (which creates the optimizer and trains) from a base class
    of another module: the decline names `Method.fit()` and base.py, not the subclass."""
    result = wrap_beside(
        tmp_path,
        {
            "base.py": """
            import torch

            class Method:
                def __init__(self, args):
                    self.net = torch.nn.Linear(4, 1)

                def fit(self, data):
                    self.optimizer = torch.optim.AdamW(self.net.parameters())
                    for x in data:
                        self.optimizer.zero_grad()
                        self.net(x).sum().backward()
                        self.optimizer.step()
            """,
            "mlp.py": "from base import Method\n\nclass MLPMethod(Method):\n    pass\n",
            "utils.py": """
            def get_method(model):
                if model == "mlp":
                    from mlp import MLPMethod
                    return MLPMethod
                raise ValueError(model)
            """,
        },
        "train_model_deep.py",
        """
        from utils import get_method

        for seed in range(3):
            method = get_method("mlp")({"seed": seed})
            method.fit([])
        """,
    )
    assert result.declined and result.reason == "optimizer created in another module"
    assert "Method.fit() of " in result.message and "base.py" in result.message
    assert "MLPMethod" not in result.message


def test_a_class_bound_to_a_factorys_result_is_followed(tmp_path: Path) -> None:
    """TabSurvey: `model_name = str2model(args.model_name)` binds a class a factory returns,
    then `model = model_name(params)`; MiniGPT-4's factory returns a name it bound to a
    registry's lookup. The classes' `fit` creates the optimizer and trains: the decline names
    it (it said "no .backward() is reached")."""
    modules = {
        "base.py": """
        import torch

        class BaseModelTorch:
            def __init__(self, params):
                self.net = torch.nn.Linear(4, 1)

            def fit(self, data):
                optimizer = torch.optim.AdamW(self.net.parameters())
                for x in data:
                    optimizer.zero_grad()
                    self.net(x).sum().backward()
                    optimizer.step()
        """,
        "mlp.py": "from base import BaseModelTorch\n\nclass MLP(BaseModelTorch):\n    pass\n",
        "models.py": """
        def str2model(model):
            if model == "MLP":
                from mlp import MLP
                return MLP
            raise NotImplementedError(model)

        def pick(model):
            chosen = str2model(model)
            return chosen
        """,
    }
    for factory in ("str2model", "pick"):
        result = wrap_beside(
            tmp_path,
            modules,
            "train.py",
            f"""
            from models import {factory}

            def main(name):
                model_name = {factory}(name)
                model = model_name({{}})
                model.fit([])

            main("MLP")
            """,
        )
        assert result.declined and result.reason == "optimizer created in another module"
        assert "BaseModelTorch.fit() of " in result.message, factory


def test_optimizers_of_objects_built_by_a_built_object_are_named(tmp_path: Path) -> None:
    """edge-connect: the script builds `EdgeConnect(config)`, whose `__init__` builds the
    `EdgeModel` that creates the Adam; the training runs through a call --wrap cannot follow
    (`getattr`): the decline names EdgeModel.__init__, found two objects down."""
    result = wrap_beside(
        tmp_path,
        {
            "models.py": """
            import torch

            class EdgeModel(torch.nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.net = torch.nn.Linear(4, 1)
                    self.gen_optimizer = torch.optim.Adam(self.net.parameters())

                def process(self, x):
                    self.gen_optimizer.zero_grad()
                    self.net(x).sum().backward()
                    self.gen_optimizer.step()
            """,
            "edge_connect.py": """
            from models import EdgeModel

            class EdgeConnect:
                def __init__(self, config):
                    self.edge_model = EdgeModel(config)

                def train(self, data):
                    for x in data:
                        getattr(self.edge_model, "process")(x)
            """,
        },
        "train.py",
        "from edge_connect import EdgeConnect\n\nEdgeConnect({}).train([])\n",
    )
    assert result.declined and result.reason == "optimizer created in another module"
    assert "EdgeModel.__init__() of " in result.message
    assert "no .backward() is reached from this script itself" in result.message


def test_a_model_method_named_backward_that_steps_names_where_optimizers_are_made(
    tmp_path: Path,
) -> None:
    """edge-connect's own loop: `self.edge_model.backward(gen_loss)` is the model's method that
    calls `gen_loss.backward()` and steps the optimizer; --wrap sees a backward there and no
    optimizer stepped beside it. The decline names where the optimizers are created (it said
    "no optimizer is stepped where .backward() runs")."""
    result = wrap_beside(
        tmp_path,
        {
            "models.py": """
            import torch

            class EdgeModel(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.net = torch.nn.Linear(4, 1)
                    self.gen_optimizer = torch.optim.Adam(self.net.parameters())

                def process(self, x):
                    self.gen_optimizer.zero_grad()
                    return self.net(x).sum()

                def backward(self, gen_loss):
                    gen_loss.backward()
                    self.gen_optimizer.step()
            """,
            "edge_connect.py": """
            from models import EdgeModel

            class EdgeConnect:
                def __init__(self):
                    self.edge_model = EdgeModel()

                def train(self, data):
                    for x in data:
                        gen_loss = self.edge_model.process(x)
                        self.edge_model.backward(gen_loss)
            """,
        },
        "train.py",
        """
        from edge_connect import EdgeConnect

        def main():
            model = EdgeConnect()
            model.train([])

        main()
        """,
    )
    assert result.declined and result.reason == "optimizer created in another module"
    assert "EdgeModel.__init__() of " in result.message


def test_a_model_a_base_constructor_builds_wrapped_by_an_overridden_method_declines(
    tmp_path: Path,
) -> None:
    """Autoformer, Informer, LTSF-Linear: `Exp_Basic.__init__` (run by `super().__init__`) sets
    `self.model = self._build_model().to(self.device)`; the subclass's `_build_model` returns
    `nn.DataParallel(model)` under `--use_multi_gpu`, and `train()` builds the Adam in
    `self._select_optimizer()`. The model is wrapped before its optimizer exists: declined
    naming the wrap (it said "cannot tell which model", and binding the factory's
    `self.model` alone would wrap the DataParallel)."""
    modules = {
        "exp_basic.py": """
        import torch

        class Exp_Basic:
            def __init__(self, args):
                self.args = args
                self.device = torch.device("cpu")
                self.model = self._build_model().to(self.device)

            def _build_model(self):
                raise NotImplementedError
        """,
    }
    script = """
    import torch
    import torch.nn as nn
    from torch import optim
    from exp_basic import Exp_Basic

    class Exp_Main(Exp_Basic):
        def __init__(self, args):
            super(Exp_Main, self).__init__(args)

        def _build_model(self):
            model = nn.Linear(4, 1).float()
            if self.args.use_multi_gpu:
                model = nn.DataParallel(model, device_ids=self.args.device_ids)
            return model

        def _select_optimizer(self):
            model_optim = optim.Adam(self.model.parameters(), lr=1e-3)
            return model_optim

        def train(self, train_loader):
            model_optim = self._select_optimizer()
            for x in train_loader:
                model_optim.zero_grad()
                self.model(x).sum().backward()
                model_optim.step()
    """
    result = wrap_beside(tmp_path, modules, "exp_main.py", script)
    assert result.declined and result.reason == "model wrapped in DDP/FSDP before the optimizer"
    assert "`self.model = self._build_model().to(self.device)`" in result.message
    assert "through _build_model()" in result.message
    # without the wrap, the factory method's `self.model` is the model the call gets
    bare = wrap_beside(tmp_path, modules, "exp_main.py", script.replace("nn.DataParallel", "id"))
    assert not bare.declined, bare.message
    assert bare.inserted == (
        "self.model, train_loader, model_optim = autoopt.optimize(self.model, train_loader, "
        'model_optim, device="cpu")',
    )


def test_an_agent_a_config_names_is_found_among_the_projects_training_modules(
    tmp_path: Path,
) -> None:
    """drq: `self.agent = hydra.utils.instantiate(cfg.agent)` builds the class a YAML names,
    and the script never imports its module: the decline names the project's training module
    that creates the optimizers (DRQAgent), not stylegan2-like projector code whose Adam
    steps a list of tensors, nor a module that builds an optimizer and trains nothing."""
    result = wrap_beside(
        tmp_path,
        {
            "drq.py": """
            import torch

            class DRQAgent:
                def __init__(self, lr):
                    self.critic = torch.nn.Linear(4, 1)
                    self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=lr)

                def update(self, x):
                    self.critic_optimizer.zero_grad()
                    self.critic(x).sum().backward()
                    self.critic_optimizer.step()
            """,
            "projector.py": """
            import torch

            def project(w):
                opt = torch.optim.Adam([w] + [w], lr=0.1)
                w.sum().backward()
                opt.step()
            """,
            "export.py": """
            import torch

            def rebuild(net):
                return torch.optim.SGD(net.parameters(), lr=0.1)
            """,
        },
        "train.py",
        """
        import hydra

        @hydra.main(config_path="config.yaml")
        def main(cfg):
            agent = hydra.utils.instantiate(cfg.agent)
            for step in range(10):
                agent.update(None)

        main()
        """,
    )
    assert result.declined and result.reason == "training loop in code --wrap cannot read"
    assert "create their optimizers in DRQAgent.__init__() of " in result.message
    assert "project()" not in result.message and "rebuild()" not in result.message


def test_an_optimizer_class_picked_from_torch_optim_by_name_is_found(tmp_path: Path) -> None:
    """Continual-Learning-Benchmark: the agent the script picks through module dictionaries
    builds `torch.optim.__dict__[config["optimizer"]](**args)`; `getattr(torch.optim, name)`
    likewise: the decline names where (it said "no .backward() is reached", nothing more)."""
    for picked in ("torch.optim.__dict__[self.name]", "getattr(torch.optim, self.name)"):
        result = wrap_beside(
            tmp_path,
            {
                "agents/__init__.py": "from . import default\n",
                "agents/default.py": f"""
                import torch

                class NormalNN:
                    def __init__(self, config):
                        self.name = config["optimizer"]
                        self.model = torch.nn.Linear(4, 1)
                        self.init_optimizer()

                    def init_optimizer(self):
                        self.optimizer = {picked}(self.model.parameters(), lr=0.1)

                    def update_model(self, x):
                        self.optimizer.zero_grad()
                        self.model(x).sum().backward()
                        self.optimizer.step()
                """,
            },
            "iBatchLearn.py",
            """
            import agents

            agent = agents.__dict__["default"].__dict__["NormalNN"]({"optimizer": "SGD"})
            agent.learn_batch([])
            """,
        )
        assert result.declined, picked
        assert "NormalNN.init_optimizer() of " in result.message, (picked, result.message)


def test_a_script_whose_project_creates_no_optimizer_says_no_loop(tmp_path: Path) -> None:
    """With no training module anywhere in the project, the decline stays "no training
    loop"."""
    result = wrap_beside(
        tmp_path,
        {"helpers.py": "def load(path):\n    return open(path).read()\n"},
        "run.py",
        "import hydra\n\nagent = hydra.utils.instantiate({})\nagent.update(None)\n",
    )
    assert result.declined and result.reason == "no training loop"


def test_agent_classes_handed_to_a_trainer_are_named(tmp_path: Path) -> None:
    """p-christ's DRL: `AGENTS = [TD3, DDPG]` is handed to the local `Trainer`, which instantiates
    each class; the agents create their optimizers in `__init__`. `optimizer.step()` in the
    base class of a module that did `from torch.optim import optimizer` creates nothing."""
    result = wrap_beside(
        tmp_path,
        {
            "base_agent.py": """
            from torch.optim import optimizer

            class BaseAgent:
                def take_optimisation_step(self, optimizer, loss):
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            "ddpg.py": """
            import torch
            from base_agent import BaseAgent

            class DDPG(BaseAgent):
                def __init__(self, config):
                    self.actor = torch.nn.Linear(4, 1)
                    self.actor_optimizer = torch.optim.Adam(self.actor.parameters())
            """,
            "td3.py": "from ddpg import DDPG\n\nclass TD3(DDPG):\n    pass\n",
            "trainer.py": """
            class Trainer:
                def __init__(self, config, agents):
                    self.config, self.agents = config, agents

                def run_games_for_agents(self):
                    for agent_class in self.agents:
                        agent_class(self.config).run_n_episodes()
            """,
        },
        "mountain_car.py",
        """
        from ddpg import DDPG
        from td3 import TD3
        from trainer import Trainer

        AGENTS = [TD3, DDPG]
        trainer = Trainer({}, AGENTS)
        trainer.run_games_for_agents()
        """,
    )
    assert result.declined and result.reason == "optimizer created in another module"
    assert "DDPG.__init__() of " in result.message
    # named once, by the class that defines it (TD3 inherits DDPG's __init__)
    assert "TD3" not in result.message and "take_optimisation_step" not in result.message


def test_a_model_method_loop_on_a_parameter_is_followed_through_the_caller(
    tmp_path: Path,
) -> None:
    """CloserLookFewShot: `train(base_loader, model, ...)` builds the Adam and calls
    `model.train_loop(epoch, base_loader, optimizer)`; `model` is a parameter, and the main
    block passes `BaselineTrain(...)`, whose method trains. The call goes in train(), after
    the optimizer."""
    result = wrap_beside(
        tmp_path,
        {
            "baselinetrain.py": """
            import torch.nn as nn

            class BaselineTrain(nn.Module):
                def __init__(self, classes):
                    super().__init__()
                    self.fc = nn.Linear(8, classes)

                def forward(self, x):
                    return self.fc(x)

                def train_loop(self, epoch, loader, optimizer):
                    for x, y in loader:
                        optimizer.zero_grad()
                        nn.functional.cross_entropy(self.forward(x), y).backward()
                        optimizer.step()
            """,
        },
        "train.py",
        """
        import torch
        from baselinetrain import BaselineTrain

        def train(base_loader, model, stop_epoch):
            optimizer = torch.optim.Adam(model.parameters())
            for epoch in range(stop_epoch):
                model.train()
                model.train_loop(epoch, base_loader, optimizer)

        if __name__ == "__main__":
            model = BaselineTrain(10)
            train(loader, model, 100)
        """,
    )
    assert not result.declined, result.message
    assert "model, base_loader, optimizer = autoopt.optimize(model, base_loader, optimizer" in (
        result.source
    )


def test_a_trainer_subclass_runs_its_base_class_loop(tmp_path: Path) -> None:
    """decision-transformer: `SequenceTrainer(Trainer)` overrides only `train_step`; the
    script calls `trainer.train_iteration(...)`, which the base class of another module
    defines (with its own `train_step`).
    The loop is reached through the base: the call goes after the optimizer (no loader: the
    batches come from `get_batch`)."""
    result = wrap_beside(
        tmp_path,
        {
            "trainer.py": """
            class Trainer:
                def __init__(self, model, optimizer, get_batch):
                    self.model, self.optimizer, self.get_batch = model, optimizer, get_batch

                def train_iteration(self, num_steps):
                    for _ in range(num_steps):
                        self.train_step()

                def train_step(self):
                    self.optimizer.zero_grad()
                    self.model(self.get_batch()).mean().backward()
                    self.optimizer.step()
            """,
            "seq_trainer.py": """
            from trainer import Trainer

            class SequenceTrainer(Trainer):
                def train_step(self):
                    x = self.get_batch()
                    self.optimizer.zero_grad()
                    self.model(x).sum().backward()
                    self.optimizer.step()
            """,
        },
        "experiment.py",
        """
        import torch
        from seq_trainer import SequenceTrainer

        def experiment(get_batch):
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.AdamW(model.parameters())
            trainer = SequenceTrainer(model=model, optimizer=optimizer, get_batch=get_batch)
            trainer.train_iteration(10)
        """,
    )
    assert not result.declined, result.message
    assert result.inserted == (
        'model, optimizer = autoopt.optimize(model, optimizer=optimizer, device="cpu")',
    )


def test_optimizers_two_methods_of_a_local_class_create_are_named(tmp_path: Path) -> None:
    """A trainer class of another module creates one optimizer in `__init__` and another in
    `fit()`, and steps both there: the decline names both places, not "several functions"."""
    result = wrap_beside(
        tmp_path,
        {
            "gan.py": """
            import torch

            class GANTrainer:
                def __init__(self):
                    self.G = torch.nn.Linear(4, 4)
                    self.D = torch.nn.Linear(4, 1)
                    self.opt_g = torch.optim.Adam(self.G.parameters())

                def fit(self, batches):
                    self.opt_d = torch.optim.Adam(self.D.parameters())
                    for x in batches:
                        self.opt_d.zero_grad()
                        self.D(x).mean().backward()
                        self.opt_d.step()
                        self.opt_g.zero_grad()
                        (-self.D(self.G(x)).mean()).backward()
                        self.opt_g.step()
            """,
        },
        "main.py",
        "from gan import GANTrainer\n\ntrainer = GANTrainer()\ntrainer.fit([])\n",
    )
    assert result.declined and result.reason == "optimizer created in another module"
    assert "GANTrainer.fit() of " in result.message
    assert "GANTrainer.__init__() of " in result.message


def test_parameter_groups_a_model_method_returns_name_that_model() -> None:
    """psa's `param_groups = model.get_parameter_groups()`, then groups of them: the model
    whose method it is feeds the optimizer."""
    source = textwrap.dedent(
        """
        import torch
        from torch.utils.data import DataLoader

        model = Net()
        loader = DataLoader(torch.randn(16, 4), batch_size=4)
        param_groups = model.get_parameter_groups()
        optimizer = torch.optim.SGD([
            {"params": param_groups[0], "lr": 0.1},
            {"params": param_groups[1], "lr": 0.2},
        ], lr=0.1)
        for x in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        """
    )
    result = wrap_source(source)
    assert result.inserted == (
        'model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device="cpu")',
    ), result.message


def test_a_model_a_local_function_moves_after_the_call_declines(tmp_path: Path) -> None:
    """TransReID: train.py builds the model and both optimizers, then hands the model to
    `do_train(..., args.local_rank)` of processor.py, whose first act is `model.to(local_rank)`:
    optimize() would keep moving inputs to its own device; declined naming the move (it was
    wrapped). `train(model, device)` doing `model.to(device)` with the call's own device is no
    move."""
    processor = """
    import torch

    def do_train(cfg, model, train_loader, optimizer, local_rank):
        device = "cuda"
        if device:
            model.to(local_rank)
        for img, vid in train_loader:
            optimizer.zero_grad()
            model(img.to(device)).sum().backward()
            optimizer.step()
    """
    script = """
    import torch
    from processor import do_train

    def main(args, cfg):
        train_loader = torch.utils.data.DataLoader(dataset, batch_size=64)
        model = make_model(cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        do_train(cfg, model, train_loader, optimizer, args.local_rank)
    """
    result = wrap_beside(tmp_path, {"processor.py": processor}, "train.py", script)
    assert result.declined and result.reason == "model moved after the call"
    assert "`model.to(local_rank)` (in do_train() of " in result.message
    same = processor.replace("local_rank):", "device):").replace(
        'device = "cuda"\n        if device:\n            model.to(local_rank)', "model.to(device)"
    )
    placed = script.replace("model = make_model(cfg)", "model = make_model(cfg).to(args.device)")
    result = wrap_beside(
        tmp_path,
        {"processor.py": same},
        "train.py",
        placed.replace("args.local_rank)", "args.device)"),
    )
    assert not result.declined, result.message
    # CLUENER: a device both files read from their config module (`model.to(config.device)`
    # in train(), the model placed on it at the call) cannot be told apart: no decline
    glob = same.replace("model.to(device)", "model.to(config.device)").replace(
        "import torch", "import torch\n    import config"
    )
    result = wrap_beside(
        tmp_path,
        {"processor.py": glob, "config.py": "device = 'cuda'\n"},
        "train.py",
        placed.replace("args.local_rank)", "args.device)"),
    )
    assert not result.declined, result.message


def test_a_trainer_constructor_placing_the_model_where_the_call_names_no_device_declines(
    tmp_path: Path,
) -> None:
    """Dual-Path-RNN: the optimizer, then `Trainer(loader, model, optimizer, opt)`, whose
    `__init__` does `Dual_RNN.to(self.device)`, `cuda:{gpuid[0]}` from a YAML or the CPU by
    branch: the call named the CPU (or no device), where the model does not stay (it was
    wrapped). Where the constructor's one device reads in the caller's names, the call gets
    it."""
    trainer = """
    import torch

    class Trainer:
        def __init__(self, train_loader, model, optimizer, opt):
            if opt["gpuid"]:
                self.device = torch.device("cuda:{}".format(opt["gpuid"][0]))
                self.model = model.to(self.device)
            else:
                self.device = torch.device("cpu")
                self.model = model.to(self.device)
            self.train_loader, self.optimizer = train_loader, optimizer

        def run(self):
            for x in self.train_loader:
                self.optimizer.zero_grad()
                self.model(x.to(self.device)).sum().backward()
                self.optimizer.step()
    """
    script = """
    import torch
    from trainer import Trainer

    def main(opt):
        train_loader = torch.utils.data.DataLoader(dataset, batch_size=64)
        model = make_model(opt)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        trainer = Trainer(train_loader, model, optimizer, opt)
        trainer.run()
    """
    result = wrap_beside(tmp_path, {"trainer.py": trainer}, "train.py", script)
    assert result.declined and result.reason == "model moved after the call", result.message
    assert "`self.model = model.to(self.device)` (in __init__() of " in result.message
    # one device, which reads in the caller's names: the call gets it
    one = trainer.replace(
        """            if opt["gpuid"]:
                self.device = torch.device("cuda:{}".format(opt["gpuid"][0]))
                self.model = model.to(self.device)
            else:
                self.device = torch.device("cpu")
                self.model = model.to(self.device)""",
        """            self.device = torch.device("cuda:{}".format(opt["gpuid"][0]))
            self.model = model.to(self.device)""",
    )
    assert one != trainer
    result = wrap_beside(tmp_path, {"trainer.py": one}, "train.py", script)
    assert result.inserted == (
        "model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
        'device=torch.device("cuda:{}".format(opt["gpuid"][0])))',
    ), result.message


def test_a_move_in_a_method_called_after_training_started_is_no_move(tmp_path: Path) -> None:
    """AGCRN: `trainer = Trainer(model, ...)` (its constructor places nothing), then
    `trainer.train()` under one flag and `trainer.test(model, trainer.args, ...)`, which does
    `model.to(args.device)`, under another: the test runs after training, no move before it.
    Reading the constructor overwrote the list of training calls with its own (empty), so the
    test's move declined the wrap."""
    trainer = """
    import torch

    class Trainer:
        def __init__(self, model, optimizer, train_loader, args):
            self.model, self.optimizer, self.train_loader = model, optimizer, train_loader
            self.args = args

        def train(self):
            for x in self.train_loader:
                self.optimizer.zero_grad()
                self.model(x.to(self.args.device)).sum().backward()
                self.optimizer.step()

        @staticmethod
        def test(model, args, loader):
            model.to(args.device)
            with torch.no_grad():
                for x in loader:
                    model(x.to(args.device))
    """
    script = """
    import torch
    from trainer import Trainer

    train_loader = torch.utils.data.DataLoader(dataset, batch_size=64)
    model = Net().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(model, optimizer, train_loader, args)
    if args.mode == "train":
        trainer.train()
    elif args.mode == "test":
        trainer.test(model, trainer.args, train_loader)
    """
    result = wrap_beside(tmp_path, {"trainer.py": trainer}, "train.py", script)
    assert result.inserted == (
        "model, train_loader, optimizer = autoopt.optimize(model, train_loader, optimizer, "
        "device=args.device)",
    ), result.message
