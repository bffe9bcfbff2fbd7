"""The training loop of 04 and 06 (:class:`Trainer`): AdamW (eps 1e-6, as the authors' ``transformers`` AdamW),
linear warm-up then cosine decay, gradient clipping, atomic checkpoints, exact resume (every random draw is
keyed by (seed, step)), DDP under ``torchrun`` (gloo on CPU, NCCL on GPU) with the loss normalised over the
*global* batch, so N processes compute the same loss and gradient as one process with the same global batch.
"""
import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from clid.base.files import DataError, Stopped
from clid.base.rng import item_seed
from clid.base.text import eos_id
from clid.data.examples import Examples
from clid.data.store import RegionCache
from clid.model.captioner import Captioner
from clid.model.checkpoints import checkpoint_exists, restore, save_checkpoint
from clid.run import runtime
from clid.training.batches import BadBatch, StepBatches
from clid.training.distributed import StopRequest
from clid.training.flags import TrainSettings
from clid.training.loss import learning_rate, masked_lm_loss

WORKER_TIMEOUT = 600  # seconds a loader process may take over one batch before the run stops


class Trainer:
    """Runs optimizer steps on batches chosen by a caller's function ``batch_for(step) -> indices``.

    On a GPU nothing inside a step waits for the device: the batches come from loader processes
    (:class:`StepBatches`, pinned memory, non-blocking copies), and the checks that need the host (a NaN or
    infinite loss or gradient norm) run every ``log_every`` steps and before every checkpoint and evaluation.
    They still guarantee what the per-step checks of the CPU do: from a non-finite step on, the optimizer
    skips every update on the device (fused AdamW's ``found_inf``), so no such step reaches the weights, and
    the check stops the run naming that step before anything is saved.
    """

    def __init__(self, model: Captioner, examples: Examples, regions: RegionCache, settings: TrainSettings,
                 out_dir, config_extra: dict, device, rank: int = 0, world: int = 1,
                 evaluate: Callable[[Captioner, int], dict] | None = None, defer_checks: bool | None = None):
        """``device``: the stage's :class:`~clid.run.runtime.DevicePlan` (or a device: its plan under
        ``settings.precision``); ``defer_checks`` overrides the plan's."""
        self.model, self.examples, self.regions, self.settings = model, examples, regions, settings
        plan = runtime.as_plan(device, settings.precision)
        self.plan = plan if defer_checks is None else plan.replace(defer_checks=defer_checks)
        self.plan.use()
        self.out_dir, self.config_extra, self.device = Path(out_dir), config_extra, plan.device
        self.rank, self.world, self.evaluate = rank, world, evaluate
        self.workers = plan.loader_workers(settings.workers)
        # the fused AdamW kernel: the same update rule as the default loop, several times faster on CPU
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.999),
                                           eps=settings.adam_eps, weight_decay=settings.weight_decay,
                                           fused=plan.fused_optimizer)
        # A key's bias adds the same number to all of a query's scores, which the softmax removes: its true
        # gradient is 0, and the computed one is rounding noise that AdamW would scale up to full steps (noise
        # that differs with the world size). It gets a gradient of 0: only the weight decay moves it.
        for layer in model.encoder.layer:
            layer.attention.self.key.bias.register_hook(torch.zeros_like)
        self.ddp = None
        if world > 1:  # DDP also starts every rank from rank 0's weights
            self.ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[plan.device] if plan.gpu else None)
        eos = eos_id(model.tokenizer)
        self.eos_class = eos if model.output_index is None else int(model.output_index[eos])
        # checks deferred to the log steps (the plan's: on a GPU; on the CPU a check costs nothing)
        self.defer_checks = self.plan.defer_checks
        self.nonfinite = torch.zeros((), device=self.device)  # 1 from the first non-finite step on (deferred checks)
        self.unchecked: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (step, loss, gradient norm)
        self.step = 0
        self.state: dict = {}
        self.pending_log: list[str] = []

    # -- resume ---------------------------------------------------------------------------------
    def resume(self) -> bool:
        """Load the last checkpoint of ``out_dir`` if there is one. Returns True if it resumed."""
        if not checkpoint_exists(self.out_dir):
            return False
        self.state = restore(self.out_dir, self.model, self.optimizer)
        self.step = int(self.state["step"])
        return True

    def continue_from(self, folder) -> None:
        """Start from the checkpoint in ``folder`` (another run's): its weights, optimizer state and step, so
        its schedule goes on."""
        self.state = restore(folder, self.model, self.optimizer)
        self.step = int(self.state["step"])

    # -- one step -------------------------------------------------------------------------------
    def train_step(self, batch) -> torch.Tensor:
        """One optimizer step on a :class:`StepBatches` item (this rank's share of the global batch); returns
        the global batch's loss, a 0-dim tensor on the device.

        The loss is normalised by the weight of the *global* batch, so that DDP's gradient averaging
        over N processes gives the step one process takes on the same global batch.
        """
        if isinstance(batch, BadBatch):
            batch.raise_it()
        settings, model = self.settings, self.model
        model.train()
        torch.manual_seed(item_seed(settings.seed, "dropout", self.step, self.rank))  # (--dropout-draws rank)
        inputs, places, classes, keys = batch  # keys: each example's dropout key (StepBatches)
        *inputs, places, classes, keys = runtime.to_device([*inputs, places, classes, keys], self.device)
        keys = keys if settings.dropout_draws == "example" else None
        with self.plan.autocast():
            logits = (self.ddp or model)(*inputs, places, grouped=self.plan.grouped_encoding, dropout_keys=keys)
        loss_sum, weight_sum = masked_lm_loss(logits, classes, self.eos_class, settings.eos_weight,
                                              settings.label_smoothing)
        total_weight, reported = weight_sum.detach().clone(), loss_sum.detach().clone()
        if self.world > 1:
            dist.all_reduce(total_weight)
            dist.all_reduce(reported)  # the global loss: every rank sees the same value and stops together
        batch_loss = reported / total_weight
        if not self.defer_checks:
            self.stop_if_not_finite(self.step + 1, batch_loss, "the training loss")
        loss = loss_sum * self.world / total_weight  # DDP averages the gradients over the ranks
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, settings.lr, settings.warmup,
                                        settings.lr_horizon or settings.max_steps)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # the norm of the (DDP-averaged) gradient; with --grad-clip 0 it is only measured (clip at inf)
        clip = settings.grad_clip if settings.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if self.defer_checks:  # no wait: this step and every later one skip their update if a value is not finite
            self.nonfinite = torch.maximum(self.nonfinite, (~(torch.isfinite(batch_loss) & torch.isfinite(norm))).float())
            self.optimizer.found_inf = self.nonfinite
            self.unchecked.append((self.step + 1, batch_loss, norm))
        else:
            self.stop_if_not_finite(self.step + 1, norm, "the gradient norm")
        self.optimizer.step()
        self.step += 1
        return batch_loss

    def check_finite(self) -> None:
        """Deferred checks: stop, naming the first step, if a loss or gradient norm since the last check was
        NaN or infinite (no such step, nor any after it, has reached the weights)."""
        if not self.unchecked:
            return
        values = torch.stack([torch.stack([loss.float(), norm.float()]) for _, loss, norm in self.unchecked]).tolist()
        steps = [step for step, _, _ in self.unchecked]
        self.unchecked = []
        for step, (loss, norm) in zip(steps, values):
            self.stop_if_not_finite(step, torch.tensor(loss), "the training loss")
            self.stop_if_not_finite(step, torch.tensor(norm), "the gradient norm")

    def stop_if_not_finite(self, step: int, value: torch.Tensor, what: str) -> None:
        """Stop the run, before the optimizer step of ``step``, when ``value`` is NaN or infinite."""
        if not bool(torch.isfinite(value)):
            raise DataError(None, None, f"{what} is {float(value)} at step {step}; stopped before its optimizer "
                                        f"step, {self.kept()}. A diverging run: try a lower --lr or a longer --warmup")

    def kept(self) -> str:
        """What the output folder holds when a run is stopped (for the error message)."""
        step = self.state.get("step")
        return f"{self.out_dir} keeps its last checkpoint (step {step})" if step else "no checkpoint was written"

    # -- checkpointing and logging --------------------------------------------------------------
    def log(self, record: dict) -> None:
        if self.rank == 0:
            self.pending_log.append(json.dumps(record))

    def save(self, extra_state: dict | None = None) -> None:
        """Checkpoint the current step (with the run's last step, ``planned_steps``: below it the checkpoint and its
        model card say it is unfinished); refuses (stops the run) if any weight is NaN or infinite."""
        self.check_finite()
        self.regions.features.check_unchanged()  # (nothing learned from a feature file that changed is saved)
        for name, tensor in self.model.state_dict().items():  # the same weights on every DDP rank
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise DataError(None, None, f"the weights hold NaN or inf after step {self.step} ({name}); not saved, "
                                            f"{self.kept()}. A diverging run: try a lower --lr or a longer --warmup")
        self.state = {"step": self.step, "planned_steps": self.settings.max_steps, **(extra_state or {})}
        if self.rank == 0:
            save_checkpoint(self.out_dir, self.model, self.optimizer, self.state, self.config_extra, self.pending_log)
            self.pending_log = []
        if self.world > 1:
            dist.barrier()

    def batches(self, batch_for: Callable[[int], np.ndarray], steps: range):
        """The batches of ``steps`` in order: made in this process, or by ``workers`` loader processes."""
        data = StepBatches(self.examples, self.model, self.regions, batch_for, steps, self.settings.seed,
                           self.rank, self.world)
        if not self.workers:
            return (data[i] for i in range(len(data)))
        if not self.regions.complete and self.regions.preload(self.examples.image_ids) and self.rank == 0:
            print(self.regions.describe(), flush=True)
        # (the tokenizer's own threads must not cross the fork either: said before it, the workers stay quiet)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=self.workers,
                                             pin_memory=self.plan.pin_memory, worker_init_fn=data.open_in_worker,
                                             multiprocessing_context="fork", prefetch_factor=4, timeout=WORKER_TIMEOUT)
        return self.watched(loader)

    def watched(self, loader):
        """The batches of ``loader``; a loader process that dies (a signal, an exit) or stops answering ends the
        run with a DataError naming the step whose batch it made and how it died (torch's own words)."""
        batches = iter(loader)
        try:
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                except (RuntimeError, ConnectionError, EOFError) as err:
                    raise self.loader_failure(err) from None
                yield batch
        finally:  # (the other processes are ended here, quietly, not at exit by torch, which would print their fate)
            try:
                batches._shutdown_workers()
            except Exception:  # noqa: BLE001 - a process already dead
                pass

    def loader_failure(self, err: Exception) -> Exception:
        """The one-line stop for a loader process's death (torch raises it in this process, at any point of a
        step: its SIGCHLD handler; or the batch's pipe breaks), or ``err`` itself when it is another error."""
        if isinstance(err, (ConnectionError, EOFError)):
            why = f"a loader process ended while it handed over a batch ({err})"
        elif str(err).startswith("DataLoader"):
            why = str(err).replace("DataLoader worker", "a loader process").split(". ")[0].strip().rstrip(".")
        elif "in DataLoader worker process" in str(err):  # (an error inside it: a full /dev/shm, a read-only one)
            why = "a loader process failed: " + str(err).strip().splitlines()[-1].removeprefix(
                f"{DataError.__module__}.DataError: ")[:300]
        else:
            return err
        return DataError(None, None, f"training stopped at step {self.step + 1}: {why} (--workers {self.workers}); "
                                     f"nothing was left half-written, {self.kept()}. The same command resumes "
                                     "(--workers 0 makes the batches in this process)")

    def run(self, end_step: int, batch_for: Callable[[int], np.ndarray], desc: str = "train",
            state_for: Callable[[int], dict] | None = None) -> None:
        """Train from the current step up to ``end_step``, checkpointing every ``save_every`` steps.

        ``state_for(step)`` adds fields to the saved training state (e.g. 06's iteration). The guards are
        helpers: a stop request (:meth:`stop_if_requested`), finite values (:meth:`train_step`, and
        :meth:`check_finite` at the steps that log, evaluate or save), a loader process's death (:meth:`guarded`).
        """
        from clid.base.progress import Progress

        bar = Progress(end_step, desc, "step", initial=self.step, disable=self.rank != 0)
        started, losses = time.time(), []
        stop = StopRequest()
        batches = self.batches(batch_for, range(self.step, end_step))
        with self.guarded(batches, bar, stop):
            for batch in batches:
                self.stop_if_requested(stop, end_step, bar, state_for)
                losses.append(self.train_step(batch))
                lr = self.optimizer.param_groups[0]["lr"]
                log_now, evaluate_now, save_now = self.due(end_step)
                if self.defer_checks:
                    if log_now or evaluate_now or save_now:
                        self.check_finite()
                    bar.update(1, lr=lr)
                else:
                    bar.update(1, loss=float(losses[-1]), lr=lr)
                if log_now:
                    self.log_losses(losses, lr, started, bar)
                    losses = []
                if evaluate_now and self.rank == 0:
                    self.log_evaluation(bar)
                if save_now:
                    self.save(state_for(self.step) if state_for else None)

    @contextlib.contextmanager
    def guarded(self, batches, bar, stop: "StopRequest"):
        """Around the loop: a loader process's death raised in it is a DataError (:meth:`loader_failure`); on the
        way out the loader processes end, the bar closes (before an error stops the run, so the error is the
        last line) and SIGTERM's handler is restored."""
        try:
            yield
        except RuntimeError as err:
            raise self.loader_failure(err) from None
        finally:
            if hasattr(batches, "close"):
                batches.close()
            bar.close()
            stop.restore()

    def stop_if_requested(self, stop: "StopRequest", end_step: int, bar, state_for) -> None:
        """When a process was asked to stop (SIGTERM), checkpoint the current step and raise Stopped (the command
        exits 128 + the signal). Every DDP rank stops at the same step; under deferred checks they agree at the log
        steps only, as agreeing waits for them all."""
        agree = not self.defer_checks or self.world == 1 or self.step % self.settings.log_every == 0
        if not (agree and stop.agreed(self.world, self.device)):
            return
        self.save(state_for(self.step) if state_for else None)
        bar.close()
        if self.rank == 0:
            print(f"stopped by {stop.name} at step {self.step} of {end_step}; the checkpoint in "
                  f"{self.out_dir} is saved: the same command resumes from it", flush=True)
        raise Stopped(128 + stop.signal, f"stopped by {stop.name} at step {self.step} of {end_step}")

    def due(self, end_step: int) -> tuple[bool, bool, bool]:
        """Whether the step just taken logs, evaluates and checkpoints."""
        settings, step = self.settings, self.step
        log_now = step % settings.log_every == 0 or step == end_step
        evaluate_now = bool(self.evaluate and settings.eval_every and step % settings.eval_every == 0)
        save_now = step % settings.save_every == 0 or step == end_step
        return log_now, evaluate_now, save_now

    def log_losses(self, losses: list[torch.Tensor], lr: float, started: float, bar) -> None:
        """The log line of the steps since the last one: their mean loss, the learning rate, the time so far."""
        mean = float(np.mean(torch.stack(losses).tolist()))
        self.log({"step": self.step, "loss": mean, "lr": lr, "seconds": round(time.time() - started, 2)})
        if self.defer_checks:
            bar.update(0, loss=mean)

    def log_evaluation(self, bar) -> None:
        """The validation check at this step: logged and written under the bar."""
        result = self.evaluate(self.model, self.step)
        self.log({"step": self.step, "eval": result})
        bar.write(f"step {self.step}: " + " ".join(f"{k}={v}" for k, v in result.items()))
