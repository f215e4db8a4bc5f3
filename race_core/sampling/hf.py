"""Transformers sampler: batched `generate` with left padding, stopping at the end of the
assistant turn, returning each sampled token with its log-probability under the policy.

The log-probs are those of the unprocessed distribution (temperature 1, no top-p), the quantity
the RL ratio exp(logp_new − logp_old) compares against; temperature and top-p only shape which
token is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from race_core.policy import pad_token_id
from race_core.render import Renderer
from race_core.sampling import Sample, SamplingParams, sample_until_stop, stop_token_ids


class HFSampler:
    name = "hf"

    def __init__(self, model, tokenizer, *, renderer: Renderer | None = None, batch_size: int = 32):
        self.model = model
        self.tokenizer = tokenizer
        self.renderer = renderer or Renderer(tokenizer)
        self.batch_size = batch_size
        self.stop_ids = stop_token_ids(tokenizer, self.renderer)
        self.pad_id = pad_token_id(tokenizer, fallback=self.stop_ids[0])
        self.device = next(model.parameters()).device

    @classmethod
    def from_pretrained(cls, checkpoint: str, *, device: str = "cpu", dtype: str = "float32", **options) -> HFSampler:
        from race_core.policy import load_policy

        model, tokenizer = load_policy(checkpoint, device=device, dtype=dtype)
        return cls(model, tokenizer, **options)

    @torch.inference_mode()
    def sample(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Sample]]:
        out: list[list[Sample]] = []
        per_call = max(1, self.batch_size // max(params.n, 1))
        generator_seed = params.seed
        for start in range(0, len(prompts), per_call):
            torch.manual_seed(generator_seed + start)
            out.extend(self._sample_batch(prompts[start:start + per_call], params))
        return out

    def _sample_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Sample]]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
            attention[row, width - len(prompt):] = 1
        was_training = self.model.training
        self.model.eval()
        greedy = params.greedy or params.temperature <= 0
        generated = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
            do_sample=not greedy, temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p, top_k=None, max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n, eos_token_id=list(self.stop_ids), pad_token_id=self.pad_id,
            output_logits=True, return_dict_in_generate=True,
        )
        self.model.train(was_training)
        new_tokens = generated.sequences[:, width:].cpu()
        raw_logprobs = torch.stack(generated.logits, dim=1).float().log_softmax(-1).cpu()
        token_logprobs = raw_logprobs.gather(-1, new_tokens[..., None])[..., 0]
        results: list[list[Sample]] = []
        for row in range(len(prompts)):
            samples = []
            for k in range(params.n):
                flat = row * params.n + k
                samples.append(self._sample(new_tokens[flat].tolist(), token_logprobs[flat].tolist()))
            results.append(samples)
        return results

    def _sample(self, ids: list[int], logprobs: list[float]) -> Sample:
        return sample_until_stop(ids, logprobs, self.stop_ids, self.tokenizer)
