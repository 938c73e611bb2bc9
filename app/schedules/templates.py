"""What a schedule enqueues at each slot: its template (one job's fields, or a workflow's
jobs), checked by the rules of POST /jobs and POST /workflows when it is saved, stored as
JSON, and loaded again at every firing; and who the jobs are enqueued as."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from marshmallow import ValidationError

from app.core.callers import Caller, Role
from app.core.errors import ValidationFailed
from app.core.priorities import Priority
from app.jobs.domain.intake import IntakeRules, new_job
from app.jobs.usecases.enqueue import GraphRequest
from app.jobs.usecases.service import JobService
from app.jobs.web.fastload import load_batch
from app.schedules.models import producer_of
from app.schedules.schemas import (
    WORKFLOW_JOBS_FIELD,
    JobTemplateSchema,
    WorkflowTemplateSchema,
    stored_workflow,
    template_json,
    workflow_template_json,
)

_NOT_IN_TEMPLATE = frozenset(JobTemplateSchema.Meta.exclude)


@dataclass(frozen=True)
class WorkflowTemplate:
    """A stored workflow template, loaded (WorkflowTemplateSchema): what each slot creates."""

    name: str | None
    jobs: list[dict[str, Any]]


class TemplateUnreadable(Exception):
    """A stored template that no longer loads (stored otherwise than through the API)."""


class ScheduleTemplates:
    """The templates' rules: those of `jobs`' intake (`intake`, POST /jobs's) and graphs."""

    def __init__(self, jobs: JobService, intake: IntakeRules) -> None:
        self.jobs = jobs
        self.intake = intake
        self._template = JobTemplateSchema()
        self._workflow_template = WorkflowTemplateSchema()

    def checked_job(self, template: dict[str, Any], name: str, now: int) -> str:
        """The loaded template as stored, once it passes the rules of POST /jobs (the type
        configured, the payload's size). Raises ValidationFailed naming job.<field>."""
        stored = template_json(template)
        try:
            new_job(self.intake, caller_of(name), template, None, now)
        except ValidationFailed as exc:
            raise ValidationFailed(
                exc.detail, errors={f"job.{field}": messages
                                    for field, messages in (exc.errors or {}).items()}) from None
        return stored

    def checked_workflow(self, workflow: dict[str, Any], name: str) -> str:
        """The loaded workflow template as stored, once it passes the rules of POST
        /workflows (each job's, the refs, no cycle). Raises ValidationFailed naming
        workflow.jobs.<n>.<field> (a cycle: workflow.jobs)."""
        ids = {f"{WORKFLOW_JOBS_FIELD}.{position}.depends_on": [
            "A schedule's workflow names its own jobs by ref; job ids are not taken (each "
            "slot's workflow would wait on the same job)."]
            for position, job in enumerate(workflow["jobs"])
            if any(isinstance(dep, int) for dep in job.get("depends_on") or ())}
        if ids:
            raise ValidationFailed("Some jobs of the workflow name job ids.", errors=ids)
        self.jobs.prepare_graph(caller_of(name), workflow["jobs"], prefix=WORKFLOW_JOBS_FIELD,
                                earlier_only=False)
        return workflow_template_json(workflow)

    def loaded(self, stored_json: str) -> dict[str, Any] | WorkflowTemplate:
        """A stored template loaded again for a firing. Raises TemplateUnreadable."""
        try:
            stored = json.loads(stored_json)
            workflow = stored_workflow(stored)
            if workflow is not None:
                loaded_workflow = self._workflow_template.load(workflow)
                return WorkflowTemplate(loaded_workflow.get("name"), loaded_workflow["jobs"])
            # A stored template passed JobTemplateSchema when saved, so it holds none of the
            # fields the template excludes; such a body loads as POST /jobs/batch's plain
            # jobs do (app/jobs/web/fastload.py, which agrees with the schema and declines to
            # it when unsure), skipping marshmallow's per-field cost at every firing.
            if isinstance(stored, dict) and not _NOT_IN_TEMPLATE.intersection(stored):
                loaded: dict[str, Any] = load_batch({"jobs": [stored]})["jobs"][0]
            else:
                loaded = self._template.load(stored)
        except (ValueError, ValidationError):
            raise TemplateUnreadable from None
        return loaded


def graph_of_slot(graph: GraphRequest, schedule: str, slot: int) -> GraphRequest:
    """The workflow's jobs for one slot: every job names the schedule, the first the slot too
    (the slot's guard, uq_jobs_schedule_scheduled_for); the others' scheduled_for is NULL."""
    items = [replace(item, values={**item.values, "schedule": schedule,
                                   "scheduled_for": slot if position == 0 else None})
             for position, item in enumerate(graph.items)]
    return replace(graph, items=items)


def caller_of(name: str) -> Caller:
    """Who a schedule's jobs are enqueued as: its own producer, with an admin's reach (only
    admins create schedules)."""
    return Caller(name=producer_of(name), role=Role.ADMIN, max_priority=Priority.CRITICAL,
                  allowed_types=None)
