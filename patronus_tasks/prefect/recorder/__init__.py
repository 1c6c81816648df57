"""The recorder process: an experiment's calls kept on Prefect, off the rows' path.

    recording.py  the experiment process's side: the process, its threads, a `Recording`
    channel.py, protocol.py
                  the frames and messages between the two processes
    main.py       the process itself (``python -m patronus_tasks.prefect.recorder.main``)
    taskruns.py   `TaskRunRecorder`: task runs and their states posted as Prefect events
    backlog.py, pace.py
                  what is held after a stall and asked of the server; the rate it sends at
    flowruns.py, kept.py
                  the flow run's states and tags; a re-run batch's kept rows' task runs

May import: Prefect's client side, `prefect.internal`/`events`/`clients`, `prefect.ui`
(the recorder publishes the artifacts), `run.background`, `run.modes` and the ground
modules. Its import weight is the process's start: nothing of `results`, `report`,
pandas or the server (tests/test_lint.py's import contracts).
"""
