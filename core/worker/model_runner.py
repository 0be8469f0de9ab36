"""ModelRunner: turns a SchedulerOutput into model inputs, runs the model, samples.

It owns the persistent InputBatch. Each step it (1) applies the scheduler's changes to
the batch, (2) fills preallocated host arrays with input_ids, positions, slot_mapping,
query_start_loc and seq_lens for the scheduled tokens only, (3) builds each KV-cache
group's attention metadata, (4) runs the model inside the forward context, and
(5) computes logits only for the rows that sample (and prompt positions whose logprobs
were asked), then samples.

With speculative decoding (`speculator` given), a request's scheduled tokens end with its
drafts: logits are computed at each of its verified positions and the rejection sampler
keeps what the target agrees with (core.worker.speculator); then the proposer drafts
for the next step, looking at the batch with the accepted tokens appended.

With LoRA (`lora` given), each step first gets slots for the batch's adapters; every
forward context then carries each token's slot (`ForwardContext.lora_mapping`).

With custom logits processors (`logits_processors` given), each step's changes of the batch
reach them as one BatchUpdate once the batch is updated, and the sampler applies them
(core.sample.logits_processors).

With a pooler (`--runner pooling`) nothing is sampled and no logits are computed: each
request whose prompt the step completes gets its pooled vector in
`ModelRunnerOutput.pooler_output`, and is done.

Under pipeline parallelism every stage runs the same steps on the same batch: a stage
after the first receives its input hidden states from the previous one, a stage before
the last sends its output to the next and returns nothing; the tokens the last stage
sampled reach the other stages with the request's next scheduling
(`CachedRequestData.new_token_ids`), so stages work on different batches at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from core.attention.interface import AttentionMetadataBuilder, CommonAttentionMetadata
from core.attention.layer import Attention
from core.compilation.graph_dispatch import (
    BatchDescriptor,
    GraphDispatcher,
    capture_batch,
    pad_for_graph,
)
from core.config import CUDAGraphMode
from core.distributed.eplb import EplbState
from core.distributed.parallel_state import GroupCoordinator, get_pp_group
from core.forward_context import ForwardContext, set_forward_context
from core.kv_cache.layout import KVCacheConfig
from core.kv_transfer.interface import KVConnector
from core.lora.interface import NO_SLOT, LoRAManager
from core.models.multimodal import SupportsMultiModal
from core.models.pipeline import IntermediateTensors
from core.platforms.device_graph import CaptureGraph
from core.pooling.interface import Pooler, PoolingSpans
from core.sample.interface import Sampler
from core.sample.logits_processors import LogitsProcessors, StepLogitsProcessors
from core.sample.logprobs import compute_prompt_logprobs
from core.sample.metadata import SamplingMetadata
from core.sampling_params import SamplingParams
from core.spec_decode.verification import num_verified
from core.worker.contract import LogprobsLists, ModelRunnerOutput, SchedulerOutput
from core.worker.grammar_bitmask import apply_grammar_bitmask
from core.worker.input_batch import CachedRequestState, InputBatch
from core.worker.mm_inputs import MultiModalInputs, mrope_step_positions
from core.worker.speculator import Speculator


@dataclass
class _StepInputs:
    req_rows: np.ndarray  # [num_reqs] batch rows in this forward, ascending
    rows: np.ndarray  # [T] batch row of each token
    positions: np.ndarray  # [T]
    query_start_loc: np.ndarray  # [num_reqs + 1]
    seq_lens: np.ndarray  # [num_reqs]


@dataclass
class _Step:
    """One step as the output paths read it."""

    so: SchedulerOutput
    inputs: _StepInputs
    num_drafts: np.ndarray  # [num_reqs] drafts scheduled for each batch row
    # Batch rows whose forward reaches the end of their known tokens and drafts: each emits
    # tokens (the others are partial prefill chunks).
    sample_rows: np.ndarray


# (tokens emitted per batch row, logprobs of the requests that asked), as chosen from the
# logits at the sampling rows' verified positions: sampled, or drafts verified.
_Emitted = tuple[dict[int, list[int]], dict[str, LogprobsLists]]
_Chooser = Callable[[torch.Tensor, _Step], _Emitted]


class ModelRunner:
    """Runs one worker's steps: persistent batch in, ModelRunnerOutput out.

    Built by the Worker once the model is loaded; `initialize_kv_cache` runs before the
    first step. What a step's output is made of is chosen here, once, for the runner's
    life: sampled tokens; with a `speculator`, verified drafts and the next step's; with
    a `pooler`, pooled vectors. Steps run one at a time, in the order they were
    scheduled: the batch carries each request's state from one to the next.
    """

    def __init__(
        self,
        model: nn.Module,
        sampler: Sampler,
        device: torch.device,
        max_num_reqs: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        vocab_size: int,
        eos_token_id: int | None,
        speculator: Speculator | None = None,
        lora: LoRAManager | None = None,
        pin_memory: bool = False,
        pooler: Pooler | None = None,
        logits_processors: LogitsProcessors | None = None,
    ) -> None:
        self.model = model
        # The engine's custom logits processors; they hear every change of the batch.
        self.logits_processors = logits_processors
        self.pooler = pooler
        self.pin_memory = pin_memory  # stage inputs in pinned host memory (Platform.pin_memory)
        # What runs the forward: the model, or its compiled form (`use_compiled`).
        self._forward: Callable[..., Any] = model
        self._graphs: GraphDispatcher | None = None  # -O2's captured graphs
        # --kv-transfer-config's connector in its worker role (`use_kv_connector`).
        self.kv_connector: KVConnector | None = None
        # --enable-eplb's load counts and expert rearrangements (`use_eplb`).
        self.eplb: EplbState | None = None
        # The data-parallel group whose engines step in lock-step (`step_in_lockstep`).
        self.lockstep: GroupCoordinator | None = None
        self.lora = lora
        self._row_slots = np.full(max_num_reqs, NO_SLOT, dtype=np.int64)  # per batch row
        self.sampler = sampler
        self.device = device
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.max_num_tokens = max_num_batched_tokens  # the most tokens one step forwards
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.requests: dict[str, CachedRequestState] = {}
        # A multimodal model's encoder outputs (None: the model takes text only).
        self.mm_inputs = (
            MultiModalInputs(model, device) if isinstance(model, SupportsMultiModal) else None
        )
        self._uses_mrope = self.mm_inputs is not None and model.uses_mrope
        self._output_path = self._choose_output_path(pooler, speculator)
        self.batch: InputBatch | None = None
        self._attention_layers = {
            m.layer_name: m for m in model.modules() if isinstance(m, Attention)
        }
        self._builders: list[tuple[AttentionMetadataBuilder, tuple[str, ...]]] = []
        # A step's forward has at most the token budget; a proposer's catch-up forward
        # also covers each sampling row's new token: one more per request.
        self._arange = np.arange(max_num_batched_tokens + max_num_reqs + 1, dtype=np.int64)

    def initialize_kv_cache(
        self, config: KVCacheConfig, builders: list[AttentionMetadataBuilder]
    ) -> None:
        """Size the batch's block tables to the groups; one metadata builder per group."""
        sizes = [group.kv_cache_spec.block_size for group in config.kv_cache_groups]
        self.batch = InputBatch(self.max_num_reqs, self.max_model_len, sizes)
        layers = [group.layer_names for group in config.kv_cache_groups]
        self._builders = list(zip(builders, layers, strict=True))

    # -- 1. state -------------------------------------------------------------------------

    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self._require_batch()
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            if req_id in batch.req_id_to_row:
                batch.remove(req_id)
        # A request not scheduled this step leaves the batch but keeps its state.
        for req_id in list(batch.req_id_to_row):
            if req_id not in so.num_scheduled_tokens:
                batch.remove(req_id)
        for new in so.scheduled_new_reqs:
            state = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=list(new.prompt_token_ids),
                sampling_params=new.sampling_params,
                generator=self._generator(new.sampling_params),
                block_ids=tuple(list(ids) for ids in new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                lora_request=new.lora_request,
                pooling_params=new.pooling_params,
                mm_features=new.mm_features or [],
            )
            if self._uses_mrope:
                table, delta = self.model.mrope_positions(state.prompt_token_ids, state.mm_features)
                state.mrope = (table.numpy(), delta)
            self.requests[new.req_id] = state
            batch.add(state)
        self._update_cached(so)
        batch.condense()
        changes = batch.changes.build(batch.num_reqs)
        if self.logits_processors is not None:
            self.logits_processors.update_state(changes)

    def _update_cached(self, so: SchedulerOutput) -> None:
        batch = self._require_batch()
        cached = so.scheduled_cached_reqs
        # A stage that did not sample them learns the request's new tokens here.
        learns_tokens = bool(cached.new_token_ids) and not get_pp_group().is_last_rank
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            if learns_tokens:
                self._append_sampled(state, cached.new_token_ids[i])
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_ids = cached.new_block_ids[i]
            if cached.resumed_from_preemption[i]:
                state.block_ids = tuple(list(ids) for ids in new_ids or ())
            elif new_ids is not None:
                for ids, added in zip(state.block_ids, new_ids, strict=True):
                    ids.extend(added)
            row = batch.req_id_to_row.get(req_id)
            if row is None:
                batch.add(state)
                continue
            batch.num_computed_tokens[row] = state.num_computed_tokens
            if new_ids is not None:
                for table, added in zip(batch.block_tables, new_ids, strict=True):
                    table.append_row(row, added)

    def _append_sampled(self, state: CachedRequestState, token_ids: list[int]) -> None:
        row = self._require_batch().req_id_to_row.get(state.req_id)
        if row is None:
            state.output_token_ids.extend(token_ids)  # the batch copies them when it adds it
            return
        for token_id in token_ids:
            self._require_batch().append_token(row, token_id)

    def _generator(self, params: SamplingParams | None) -> torch.Generator | None:
        if params is None or params.seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(params.seed)

    # -- 2. inputs ------------------------------------------------------------------------

    def _prepare_step(self, so: SchedulerOutput) -> _Step:
        """The step's inputs, each request's drafts written after its known tokens and
        each row's adapter slot taken."""
        if self.lora is not None:
            self._activate_adapters(self.lora)
        self._write_drafts(so)
        batch = self._require_batch()
        num_reqs = batch.num_reqs
        counts = np.array(
            [so.num_scheduled_tokens[state.req_id] for state in batch.rows[:num_reqs]],
            dtype=np.int64,
        )
        inputs = self._step_inputs(
            self._arange[:num_reqs], counts, batch.num_computed_tokens[:num_reqs]
        )
        num_drafts = self._num_drafts(so)
        known = batch.num_tokens[:num_reqs] + num_drafts
        if np.any(inputs.seq_lens > known):
            raise ValueError("scheduled tokens beyond a request's known tokens and drafts")
        return _Step(so, inputs, num_drafts, np.flatnonzero(inputs.seq_lens == known))

    def _num_drafts(self, so: SchedulerOutput) -> np.ndarray:
        """[num_reqs] drafts scheduled for each batch row."""
        batch = self._require_batch()
        drafts = so.scheduled_spec_decode_tokens
        return np.array(
            [len(drafts.get(state.req_id, ())) for state in batch.rows[: batch.num_reqs]],
            dtype=np.int64,
        )

    def _write_drafts(self, so: SchedulerOutput) -> None:
        """Put each request's drafts after its known tokens, where the forward reads them."""
        batch = self._require_batch()
        for req_id, drafts in so.scheduled_spec_decode_tokens.items():
            row, count = batch.req_id_to_row[req_id], len(drafts)
            start = int(batch.num_tokens[row])
            batch.token_ids[row, start : start + count] = drafts

    def _step_inputs(
        self, req_rows: np.ndarray, counts: np.ndarray, starts: np.ndarray
    ) -> _StepInputs:
        """Inputs of a forward over `counts[i]` tokens of batch row `req_rows[i]` from
        position `starts[i]` on."""
        query_start_loc = np.zeros(len(req_rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=query_start_loc[1:])
        total = int(query_start_loc[-1])
        local = np.repeat(self._arange[: len(req_rows)], counts)  # [T]
        offsets = self._arange[:total] - query_start_loc[local]  # [T] index within the request
        positions = starts[local] + offsets
        return _StepInputs(req_rows, req_rows[local], positions, query_start_loc, starts + counts)

    def forward_context(self, rows: np.ndarray, positions: np.ndarray) -> ForwardContext:
        """The context of a forward over tokens at (`rows`, `positions`): rows ascending,
        each row's positions consecutive (what a proposer runs; see ProposalBatch)."""
        req_rows, first, counts = np.unique(rows, return_index=True, return_counts=True)
        inputs = self._step_inputs(req_rows, counts, positions[first])
        return self._context(inputs)

    def _context(self, inputs: _StepInputs, graph: BatchDescriptor | None = None) -> ForwardContext:
        """The forward context of `inputs`, padded for `graph` when it replays one."""
        return ForwardContext(
            self._attention_metadata(inputs, graph),
            len(inputs.rows),
            lora_mapping=None
            if self.lora is None
            else self.lora.mapping(self._tensor(self._row_slots[inputs.rows])),
            attention_layers=self._attention_layers,
            piecewise_size=_piecewise_size(graph),
            kv_connector=self.kv_connector,
        )

    def _activate_adapters(self, lora: LoRAManager) -> None:
        """Slots for the batch's adapters, and each batch row's slot (NO_SLOT: base model)."""
        batch = self._require_batch()
        states = batch.rows[: batch.num_reqs]
        slots = lora.activate({s.lora_request for s in states if s.lora_request is not None})
        self._row_slots[: batch.num_reqs] = [
            NO_SLOT if s.lora_request is None else slots[s.lora_request.lora_int_id] for s in states
        ]

    def _attention_metadata(
        self, inputs: _StepInputs, graph: BatchDescriptor | None
    ) -> dict[str, Any]:
        num_reqs = len(inputs.seq_lens)
        query_lens = np.diff(inputs.query_start_loc)
        per_layer: dict[str, Any] = {}
        for (builder, layer_names), table in zip(
            self._builders, self._require_batch().block_tables, strict=True
        ):
            common = CommonAttentionMetadata(
                query_start_loc=self._tensor(inputs.query_start_loc, torch.int32),
                seq_lens=self._tensor(inputs.seq_lens, torch.int32),
                num_computed_tokens=self._tensor(inputs.seq_lens - query_lens, torch.int32),
                block_table=_select_rows(table.tensor, inputs.req_rows).to(self.device),
                slot_mapping=self._tensor(table.slot_mapping(inputs.rows, inputs.positions)),
                num_reqs=num_reqs,
                num_actual_tokens=len(inputs.rows),
                max_query_len=int(query_lens.max(initial=0)),
                max_seq_len=int(inputs.seq_lens.max(initial=0)),
            )
            metadata = builder.build(pad_for_graph(common, graph, self.max_model_len))
            per_layer.update(dict.fromkeys(layer_names, metadata))
        return per_layer

    def _tensor(self, array: np.ndarray, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """`array` on the device as `dtype`. With pin_memory it is staged in pinned host
        memory and copied without blocking the host (torch's pinned allocator keeps the
        staging buffer until the copy is done); otherwise copied plainly, which on the CPU
        with a matching dtype copies nothing: the tensor shares the array's memory."""
        host = torch.from_numpy(array)
        if not self.pin_memory:
            return host.to(device=self.device, dtype=dtype)
        return host.to(dtype).pin_memory().to(self.device, non_blocking=True)

    # -- 3. step --------------------------------------------------------------------------

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step `so` describes and return what it emitted.

        Steps arrive in the order they were scheduled, each once, on every pipeline stage.
        The output has one entry per request in the batch (every request scheduled, in
        batch order): `sampled_token_ids` the tokens each emitted (one; after drafts, the
        accepted drafts and the target's own; none for a partial prefill chunk), already
        appended to the batch; `logprobs` and `prompt_logprobs` for the requests that
        asked; with a speculator `spec_token_ids`, the next step's drafts; with a pooler
        `pooler_output`, the vectors of the prompts the step completed. A stage before
        the last, or a step with nothing scheduled, emits nothing.
        """
        self._update_states(so)
        if self.mm_inputs is not None:
            self.mm_inputs.update(so, self.requests)
        output = self._execute_with_connector(so)
        if self.eplb is not None:
            output.expert_imbalance = self.eplb.imbalance()
        return output

    def _execute_with_connector(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """The step inside the KV connector's worker-role calls, if there is one."""
        connector = self.kv_connector
        if connector is None:
            return self._execute(so)
        connector.bind_connector_metadata(so.kv_connector_metadata)
        try:
            connector.start_load_kv(ForwardContext({}, 0))
            output = self._execute(so)
            connector.wait_for_save()  # after sampling, which it may overlap
            output.kv_connector_output = connector.get_finished(so.finished_req_ids)
        finally:
            connector.clear_connector_metadata()
        return output

    def use_eplb(self, eplb: EplbState) -> None:
        """Count the experts' load after every forward step and rearrange them on time."""
        self.eplb = eplb

    def step_in_lockstep(self, dp: GroupCoordinator) -> None:
        """Forward on every step of `dp`'s engines together (experts spanning them: each
        forward's expert layers exchange tokens across them), a placeholder token when
        this engine has none while another has some."""
        self.lockstep = dp

    def use_kv_connector(self, connector: KVConnector) -> None:
        """Run every step inside `connector`'s worker-role calls (its caches registered)."""
        self.kv_connector = connector

    def _execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        tokens = so.total_num_scheduled_tokens if self._require_batch().num_reqs else 0
        if self.lockstep is not None:
            return self._execute_in_lockstep(so, tokens, self.lockstep)
        return self._forward_step(so) if tokens else self._output()

    def _execute_in_lockstep(
        self, so: SchedulerOutput, tokens: int, dp: GroupCoordinator
    ) -> ModelRunnerOutput:
        """The step, or a one-token dummy forward when only other engines have tokens, or
        nothing when none has: every engine makes the same choice from the summed count."""
        across = int(dp.all_reduce(torch.tensor([tokens], device=self.device)).item())
        if tokens:
            output = self._forward_step(so)
        else:
            if across:
                self.dummy_run(1)
                if self.eplb is not None:
                    self.eplb.step()  # the other engines' forward closes a step too
            output = self._output()
        output.num_tokens_across_dp = across
        return output

    def _forward_step(self, so: SchedulerOutput) -> ModelRunnerOutput:
        step = self._prepare_step(so)
        hidden = self._run_forward(step.inputs)
        if self.eplb is not None:
            self.eplb.step()  # every rank of a stage forwards each step: they stay in step
        if not get_pp_group().is_last_rank:  # its output went on to the next stage
            return self._output()
        return self._output_path(hidden, step)

    def _run_forward(self, inputs: _StepInputs) -> torch.Tensor | None:
        """The hidden states [T, H] of the forward over `inputs` (None on a stage before
        the last): a captured graph where one fits, else the model, else this stage."""
        batch = self._require_batch()
        input_ids = self._tensor(batch.token_ids[inputs.rows, inputs.positions])
        positions = self._tensor(inputs.positions)
        pp = get_pp_group()
        graph = self._graph_for(inputs)
        with set_forward_context(self._context(inputs, graph)):
            if graph is not None:
                return self._graphs.run(graph, input_ids, positions)
            if self.mm_inputs is not None:
                return self._multimodal_forward(self.mm_inputs, inputs, input_ids, positions)
            if pp.world_size == 1:
                return self._forward(input_ids, positions, **self._token_types(inputs))
            return self._pipeline_stage(pp, input_ids, positions)

    def _token_types(self, inputs: _StepInputs) -> dict[str, torch.Tensor]:
        """`token_type_ids` [T] for an encoder that takes them (`takes_token_type_ids`)
        when the step holds a scored pair with types: 1 from its second text on
        (PoolingParams.second_text_start), else 0. Empty when there is none."""
        if not getattr(self.model, "takes_token_type_ids", False):
            return {}
        batch = self._require_batch()
        params = [batch.rows[row].pooling_params for row in inputs.req_rows]
        starts = [p.second_text_start if p is not None else None for p in params]
        if not any(starts):
            return {}
        no_pair = self.max_model_len  # past every position: type 0 throughout
        bounds = np.array([no_pair if s is None else s for s in starts], dtype=np.int64)
        per_token = np.repeat(bounds, np.diff(inputs.query_start_loc))  # [T]
        return {"token_type_ids": self._tensor(inputs.positions >= per_token)}

    def _multimodal_forward(
        self,
        mm: MultiModalInputs,
        inputs: _StepInputs,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """The forward on token embeddings with the items' rows merged in (and, for
        M-RoPE, [3, T] positions)."""
        batch = self._require_batch()
        states = [batch.rows[row] for row in inputs.req_rows]
        counts = np.diff(inputs.query_start_loc)
        embeds = mm.merge(
            self.model.embed_input_ids(input_ids),
            states,
            inputs.seq_lens - counts,
            inputs.query_start_loc,
        )
        if self._uses_mrope:
            positions = mrope_step_positions(
                batch.rows, inputs.req_rows, inputs.rows, inputs.positions
            ).to(self.device)
        return self._forward(input_ids, positions, inputs_embeds=embeds)

    def _pipeline_stage(
        self, pp: GroupCoordinator, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor | None:
        """Run this stage: its input from the previous stage (unless first), its output to
        the next (unless last: then the hidden states to compute logits from)."""
        received = None if pp.is_first_rank else IntermediateTensors(pp.recv_tensor_dict())
        out = self.model(input_ids, positions, intermediate_tensors=received)
        if pp.is_last_rank:
            return out
        pp.send_tensor_dict(out.tensors)
        return None

    @torch.inference_mode()
    def capture_graphs(
        self,
        mode: CUDAGraphMode,
        capture: CaptureGraph,
        sizes: list[int],
    ) -> None:
        """-O2: capture graphs of the forward at each of `sizes` (core.compilation.
        graph_dispatch); needs the KV cache, builders whose backend supports FULL graphs
        for a FULL mode, and the forward compiled with capture for a PIECEWISE one."""
        graphs = GraphDispatcher(mode, capture, self._forward, sizes, self.device)
        graphs.capture_all(self._capture_context)
        self._graphs = graphs

    @property
    def graphs(self) -> GraphDispatcher | None:
        """The captured graphs (-O2), None without graph capture."""
        return self._graphs

    def _capture_context(self, graph: BatchDescriptor) -> ForwardContext:
        per_layer: dict[str, Any] = {}
        for (builder, layer_names), table in zip(
            self._builders, self._require_batch().block_tables, strict=True
        ):
            common = capture_batch(graph, table.tensor.shape[1], self.max_model_len, self.device)
            per_layer.update(dict.fromkeys(layer_names, builder.build(common)))
        return ForwardContext(
            per_layer,
            graph.num_tokens,
            attention_layers=self._attention_layers,
            piecewise_size=_piecewise_size(graph),
            kv_connector=self.kv_connector,
        )

    def _graph_for(self, inputs: _StepInputs) -> BatchDescriptor | None:
        """The captured graphs this step replays, if any."""
        if self._graphs is None:
            return None
        return self._graphs.descriptor(len(inputs.req_rows), len(inputs.rows))

    def use_compiled(self, forward: Callable[..., Any]) -> None:
        """Run steps through `forward` (the model compiled: same signature) from now on."""
        self._forward = forward

    @torch.inference_mode()
    def dummy_run(self, num_tokens: int) -> None:
        """A forward of `num_tokens` placeholder tokens and the logits of up to
        max_num_reqs of them, without attention metadata (attention outputs zeros) and
        without touching the batch: warms compilation and measures activation memory
        before the KV cache exists."""
        input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        positions = torch.arange(num_tokens, device=self.device) % self.max_model_len
        if self._uses_mrope:
            positions = positions.expand(3, num_tokens)
        context = ForwardContext({}, num_tokens, attention_layers=self._attention_layers)
        pp = get_pp_group()
        with set_forward_context(context):
            if pp.is_first_rank:
                hidden = self._forward(input_ids, positions)
            else:
                hidden_size = self.model.config.hidden_size
                dtype = next(self.model.parameters()).dtype
                placeholder = torch.zeros(num_tokens, hidden_size, dtype=dtype, device=self.device)
                received = IntermediateTensors({"hidden_states": placeholder})
                hidden = self.model(input_ids, positions, intermediate_tensors=received)
        if pp.is_last_rank and self.pooler is None:
            self.model.compute_logits(hidden[: min(num_tokens, self.max_num_reqs)])
        if self.eplb is not None:
            self.eplb.discard()  # placeholder tokens are not traffic

    # -- 4. output ------------------------------------------------------------------------

    def _choose_output_path(
        self, pooler: Pooler | None, speculator: Speculator | None
    ) -> Callable[[torch.Tensor, _Step], ModelRunnerOutput]:
        """What makes a step's output, for the runner's life. The engine config refuses
        speculation with --runner pooling, so at most one of the two is given."""
        if pooler is not None:
            return partial(self._pooled_output, pooler)
        if speculator is not None:
            return partial(self._speculative_output, speculator)
        return self._sampled_output

    def _output(
        self, sampled: Mapping[int, list[int]] | None = None, **fields: Any
    ) -> ModelRunnerOutput:
        """Every ModelRunnerOutput is made here: the batch's requests in batch order, each
        with the tokens its row emitted (`sampled[row]`, none where absent), and the other
        `fields` of ModelRunnerOutput as given."""
        req_ids = self._require_batch().req_ids
        emitted = sampled or {}
        return ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=[emitted.get(row, []) for row in range(len(req_ids))],
            **fields,
        )

    def _sampled_output(self, hidden: torch.Tensor, step: _Step) -> ModelRunnerOutput:
        """One token sampled for each row that reaches the end of its known tokens."""
        return self._emit(hidden, step, self._sample)

    def _speculative_output(
        self, speculator: Speculator, hidden: torch.Tensor, step: _Step
    ) -> ModelRunnerOutput:
        """The scheduled drafts verified (a token sampled where none were scheduled), then
        drafts proposed for the next step, looking at the batch with the new tokens."""
        speculator.forget(step.so.finished_req_ids)
        choose = partial(self._verify, speculator) if step.num_drafts.any() else self._sample
        output = self._emit(hidden, step, choose)
        output.spec_token_ids = speculator.propose(
            self._require_batch(), step.sample_rows, step.inputs.seq_lens, self.forward_context
        )
        return output

    def _pooled_output(
        self, pooler: Pooler, hidden: torch.Tensor, step: _Step
    ) -> ModelRunnerOutput:
        """The pooled vector of each request whose prompt the step completes; no tokens."""
        rows = step.sample_rows
        if len(rows) == 0:
            return self._output()
        batch = self._require_batch()
        states = [batch.rows[row] for row in rows]
        starts = step.inputs.query_start_loc  # [num_reqs + 1]
        spans = PoolingSpans(starts=self._tensor(starts[rows]), ends=self._tensor(starts[rows + 1]))
        vectors = pooler.pool(hidden, spans, [s.pooling_params for s in states])
        pooled = {s.req_id: v.tolist() for s, v in zip(states, vectors, strict=True)}
        return self._output(pooler_output=pooled)

    def _emit(self, hidden: torch.Tensor, step: _Step, choose: _Chooser) -> ModelRunnerOutput:
        """Logits at each sampling row's verified positions (its drafts' and the one after
        them: its last alone without drafts) and at the prompt positions whose logprobs
        were asked; the tokens `choose` picks from the first, appended to the batch."""
        spans, prompt_index, prompt_targets = self._prompt_logprob_positions(step.inputs)
        sample_index = _last_positions(
            step.inputs.query_start_loc, step.sample_rows, num_verified(step.num_drafts)
        )
        logits = self.model.compute_logits(
            hidden[self._tensor(np.concatenate([sample_index, prompt_index]))]
        )  # [num_sample_positions + num_prompt_positions, V]
        sampled, logprobs = choose(logits[: len(sample_index)], step)
        self._append_emitted(sampled)
        prompt_logprobs = self._prompt_logprobs(logits[len(sample_index) :], spans, prompt_targets)
        return self._output(sampled, logprobs=logprobs, prompt_logprobs=prompt_logprobs)

    def _append_emitted(self, sampled: Mapping[int, list[int]]) -> None:
        batch = self._require_batch()
        for row, token_ids in sampled.items():
            for token_id in token_ids:
                batch.append_token(row, token_id)

    def _sample(self, logits: torch.Tensor, step: _Step) -> _Emitted:
        """Sample a token for each sampling row ([num_sample_rows, V] logits)."""
        rows = step.sample_rows.tolist()
        if not rows:
            return {}, {}
        batch = self._require_batch()
        chosen = [batch.rows[row] for row in rows]
        bitmask = step.so.grammar_bitmask
        if bitmask is not None:  # structured output: forbidden tokens get -inf
            apply_grammar_bitmask(logits, [s.req_id for s in chosen], bitmask)
        metadata = self._metadata(
            chosen, [s.output_token_ids for s in chosen], self._step_processors(rows)
        )
        result = self.sampler(logits, metadata)
        token_ids = result.sampled_token_ids.tolist()
        logprobs: dict[str, LogprobsLists] = {}
        for i, state in enumerate(chosen):
            k = state.sampling_params.logprobs
            if k is not None and result.logprobs is not None:
                logprobs[state.req_id] = LogprobsLists.from_tensors(result.logprobs, i, i + 1, k)
        return {row: [token_id] for row, token_id in zip(rows, token_ids, strict=True)}, logprobs

    def _verify(self, speculator: Speculator, logits: torch.Tensor, step: _Step) -> _Emitted:
        """Rejection-sample the drafts of the sampling rows ([sum(n + 1), V] logits)."""
        batch = self._require_batch()
        rows = step.sample_rows.tolist()
        states = [batch.rows[row] for row in rows]
        drafts = [step.so.scheduled_spec_decode_tokens.get(s.req_id, []) for s in states]
        emitted, logprobs = speculator.verify(
            self.sampler, logits, states, drafts, step.so.grammar_bitmask, self._metadata
        )
        return dict(zip(rows, emitted, strict=True)), logprobs

    def _step_processors(self, rows: list[int]) -> StepLogitsProcessors | None:
        """The custom logits processors of a step sampling batch `rows`, if any."""
        if self.logits_processors is None:
            return None
        return self.logits_processors.of_step(rows, self._require_batch().num_reqs)

    def _metadata(
        self,
        states: list[CachedRequestState],
        output_token_ids: list[list[int]],
        logits_processors: StepLogitsProcessors | None = None,
    ) -> SamplingMetadata:
        """Sampling metadata with row i from `states[i]` and `output_token_ids[i]`."""
        generators = {i: s.generator for i, s in enumerate(states) if s.generator is not None}
        return SamplingMetadata.from_params(
            [s.sampling_params for s in states],
            output_token_ids=output_token_ids,
            prompt_token_ids=[s.prompt_token_ids for s in states],
            vocab_size=self.vocab_size,
            generators=generators,
            eos_token_id=self.eos_token_id,
            device=self.device,
            logits_processors=logits_processors,
        )

    def _prompt_logprob_positions(
        self, inputs: _StepInputs
    ) -> tuple[list[tuple[str, int, int]], np.ndarray, np.ndarray]:
        """([(req_id, start, end) into the prompt slices], hidden indices, target ids).

        A prompt position p predicts prompt token p + 1, so the last prompt position
        (which predicts the first output token) has no prompt logprob.
        """
        batch = self._require_batch()
        spans, indices, targets = [], [], []
        for row in range(batch.num_reqs):
            state = batch.rows[row]
            if state is None or state.sampling_params.prompt_logprobs is None:
                continue
            start = int(inputs.query_start_loc[row])
            first = int(inputs.seq_lens[row]) - (int(inputs.query_start_loc[row + 1]) - start)
            last = min(int(inputs.seq_lens[row]), len(state.prompt_token_ids) - 1)
            if last <= first:
                continue
            spans.append((state.req_id, len(indices), len(indices) + last - first))
            indices.extend(range(start, start + last - first))
            targets.extend(state.prompt_token_ids[first + 1 : last + 1])
        return spans, np.array(indices, dtype=np.int64), np.array(targets, dtype=np.int64)

    def _prompt_logprobs(
        self, logits: torch.Tensor, spans: list[tuple[str, int, int]], targets: np.ndarray
    ) -> dict[str, LogprobsLists]:
        if not spans:
            return {}
        k = max(self.requests[req_id].sampling_params.prompt_logprobs or 0 for req_id, *_ in spans)
        tensors = compute_prompt_logprobs(logits, self._tensor(targets), k)
        params = {req_id: self.requests[req_id].sampling_params for req_id, *_ in spans}
        return {
            req_id: LogprobsLists.from_tensors(tensors, start, end, params[req_id].prompt_logprobs)
            for req_id, start, end in spans
        }

    def _require_batch(self) -> InputBatch:
        if self.batch is None:
            raise RuntimeError("initialize_kv_cache must run before the first step")
        return self.batch


def _piecewise_size(graph: BatchDescriptor | None) -> int | None:
    """The size whose piece graphs a forward replays: PIECEWISE steps only (a FULL graph
    replays as a whole; inside its capture the pieces run plainly)."""
    return None if graph is None or graph.uniform_decode else graph.num_tokens


def _select_rows(table: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """table[rows]; a view when rows are 0..n-1 (every step's main forward)."""
    if len(rows) == 0 or (rows[0] == 0 and rows[-1] == len(rows) - 1):
        return table[: len(rows)]
    return table[torch.from_numpy(rows)]


def _last_positions(
    query_start_loc: np.ndarray, rows: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Token indices of the last counts[r] tokens of each of `rows`, in order:
    query_start_loc [0, 3, 5], rows [0, 1], counts [2, 1] -> [1, 2, 4]."""
    counts = counts[rows]
    ends = np.repeat(query_start_loc[rows + 1], counts)  # one past each row's last token
    distance = np.repeat(np.cumsum(counts), counts) - np.arange(int(counts.sum()))  # to the end
    return ends - distance
