"""Step 2 of the pipeline: load service prompts (:mod:`~draftfit.prompts.loading`) and draw a
seeded, length-stratified sample (:mod:`~draftfit.prompts.sampling`).

Loading (:func:`load_prompts`)
    JSONL (``.jsonl``/``.ndjson``; ``.json`` may be JSONL or one JSON array), CSV, Parquet, or a
    directory written by ``datasets.Dataset.save_to_disk``. Each row holds either a plain text
    prompt (column ``prompt``) or a chat conversation (column ``messages``: a list of
    ``{"role", "content"}``; in CSV a JSON string), plus an optional ``category``. Column names are
    configurable. When a row has both, ``messages`` is used. Content given as a list of OpenAI
    text parts is joined with newlines, as vLLM does. Files are parsed here rather than through the
    ``datasets`` builders so that every error names the file and the line or row, and nothing is
    written to the ``datasets`` cache. The result is a ``datasets.Dataset`` with the columns
    ``row`` (the 0-based index of the record in the source: the prompt's stable id), ``prompt``,
    ``messages`` and ``category``.

Sampling (:func:`sample_prompts`)
    1. Every row becomes the exact input the target sees. Chat rows go through the target's chat
       template (with the generation prompt). Plain ``prompt`` rows are treated as the user
       message of a one-turn chat — the usual meaning of a service log's prompt column — when the
       tokenizer has a chat template and the text is not already templated (``template="auto"``);
       ``"always"``/``"never"`` force either way. Text sent without a template is tokenized the way
       vLLM's completion API does it (``add_special_tokens=True``); rendered chats without added
       special tokens, as vLLM's chat API does.
    2. Optional scrub of e-mails, phone numbers and card numbers (:mod:`draftfit.scrub`) in the
       message text before templating.
    3. Rows longer than ``max_input_tokens`` are dropped and reported (never truncated). Pass the
       target's ``max_model_len`` minus the study's ``max_tokens`` so every response fits.
    4. Buckets by input tokens: short ≤ ``short_max`` < medium ≤ ``medium_max`` < long. The
       defaults (256, 1024) suit chat traffic: a chat turn with a system prompt is usually under
       256 tokens, pasted code or an e-mail thread lands in 257-1024, and documents to summarize or
       retrieved context run past 1024.
    5. ``n`` rows drawn with scikit-learn's ``StratifiedShuffleSplit`` on the bucket labels, seeded:
       the sample keeps the buckets' proportions (largest-remainder allocation). A bucket with a
       single row is merged into the largest bucket for the draw (scikit-learn needs two per
       stratum); when ``n`` is smaller than the number of populated buckets the draw is a plain
       seeded shuffle. If ``n`` exceeds the eligible rows, a :class:`PromptWarning` is issued and
       all of them are taken — a short log is still worth measuring.

Row ids and a short hash (:func:`prompt_digest`), never prompt text, appear in errors, warnings
and logs; ``sample_prompts(show_prompts=True)`` adds the start of the text of dropped rows. JSONL
and CSV files are read a line at a time; one line may hold at most :data:`MAX_RECORD_BYTES`.
"""

