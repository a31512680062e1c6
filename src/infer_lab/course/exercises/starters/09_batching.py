"""Chapter 09 · Batching: exercises.

Fill in each function, then run `infer-lab check 09`.
"""


def admit_count(waiting_prompt_lens: list[int], num_running: int, free_blocks: int, block_size: int,
                max_num_seqs: int, policy: str) -> int:
    """How many waiting requests the scheduler admits into the next step.

    The running requests already have room for their next token. A waiting request needs
    enough free KV blocks of ``block_size`` tokens for its whole prompt, and a batch slot:
    at most ``max_num_seqs`` requests run at once. The queue is first come, first served.
    ``policy`` is ``"continuous"`` (admit every step) or ``"static"`` (admit only into an
    empty batch).
    """
    raise NotImplementedError


def batching_steps(output_lens: list[int], max_num_seqs: int, policy: str) -> int:
    """Predict how many engine steps it takes to finish all requests.

    All requests arrive at once, in order, with short prompts and plenty of KV memory. Each
    step, every running request gets one new token (its first step computes the prompt and
    yields the first token); a request leaves when it has its ``output_lens[i]`` tokens. At
    most ``max_num_seqs`` run at once. ``"static"``: a new batch starts only when the whole
    previous batch is done. ``"continuous"``: a free slot is refilled at the next step.
    """
    raise NotImplementedError
