"""The Celery application the worker runs (`celery -A tests.celery.tasks
worker`): quorum queues and a topic exchange, so Celery 5.5+'s native
delayed delivery is on (countdown and ETA tasks wait in the broker, in
quorum queues with TTLs that dead-letter into each other, not in the
worker). Each task appends a JSON line to $SHOAL_CELERY_OUT."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

app = Celery("shoal-tests", broker=os.environ.get("SHOAL_CELERY_BROKER", "amqp://"))
app.conf.update(
    task_default_queue="tasks",
    task_default_exchange="tasks",
    task_default_exchange_type="topic",
    task_default_routing_key="tasks",
    task_default_queue_type="quorum",
    worker_detect_quorum_queues=True,
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    task_queues=[
        Queue(
            "tasks",
            Exchange("tasks", type="topic"),
            routing_key="tasks",
            queue_arguments={"x-queue-type": "quorum"},
        )
    ],
)


def _record(task: str, **fields: Any) -> None:
    with open(os.environ["SHOAL_CELERY_OUT"], "a") as out:
        out.write(json.dumps({"task": task, "at": time.time(), **fields}) + "\n")


@app.task(bind=True)
def stamp(self: Any, label: str) -> None:
    _record("stamp", label=label)


@app.task(bind=True, max_retries=3)
def flaky(self: Any, label: str) -> None:
    """Fails twice, each time retried with a countdown of 2 s."""
    _record("flaky", label=label, retries=self.request.retries)
    if self.request.retries < 2:
        raise self.retry(countdown=2)
