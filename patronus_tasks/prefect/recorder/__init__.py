"""The recorder process: an experiment's calls kept on Prefect, off the rows' path.

    recording.py  the experiment process's side: the process, its threads, a `Recording`
    channel.py    the frames on the pipe between the two processes (`prefect.protocol`:
                  what they say)
    main.py       the process itself (``python -m patronus_tasks.prefect.recorder``: its
                  ``__main__`` defers coolname, which Prefect imports unused: `lazy`)
    taskruns.py   `TaskRunRecorder`: task runs and their states queued as Prefect events
    outbox.py     its `Outbox`: the batches waiting, in the order they go, and its counts
    poster.py     its `Poster`: posts them, asks what the server holds, resends the rest
    backlog.py    what is held after a stall, and asked of the server (the pace a server
                  that limits the rate allows: `http.Pace`)

May import: Prefect's client side, the modules of `prefect` shared by its rooms, `ui`
(the recorder publishes the artifacts), `server.hook`, `run.background`, `run.modes`
and the ground modules. `main`'s imports are the process's start-up: nothing of pandas,
pyarrow, `record`, `results` or `report` (pyproject's import contracts, checked by
tests/test_lint.py); the post-run's modules load in a thread from there on (`main._preload`).
"""
