"""Go on with a review nobody answered: `review()` on a deployment suspends its flow run
(its process ends, the worker is free) and schedules a run of this deployment at the
review's deadline. If that page is still unanswered then, the suspended run is resumed
with no answer: it runs again, finds none, and goes on ("0 of 10 reviewed; nobody
answered within 3600 s"), what it labelled before kept. Answered in time, this run does
nothing. (Prefect's own deadline, a little later, would fail the run instead.)
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from patronus_tasks.prefect.pause import wake_unanswered


@flow(name="review-timeout", flow_run_name="review deadline of {flow_run_id}")
def review_timeout(flow_run_id: str, pause_key: str, timeout: int) -> str:
    """Resume the suspended flow run ``flow_run_id`` if its review page ``pause_key`` is
    still waiting; say what was done.

    Args:
        flow_run_id: The suspended flow run whose review page has come to its deadline.
        pause_key: The page it waits on (a later page, or none, means it was answered).
        timeout: The page's seconds to answer in, said in the run's message.
    """
    said = wake_unanswered(flow_run_id, pause_key, timeout)
    get_run_logger().info("%s", said)
    return said
