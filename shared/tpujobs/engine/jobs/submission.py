"""A submitted spec becomes one job, at most once, and is admitted.

Both ways in, tpujobs-submit (whose `owner` is a claim) and the jobs API (whose owner is the
caller its ID token proved), go through the same vetting (`Vetting.vet`) and the same accept.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from tpujobs.domain.job import SubmittedVia, new_job
from tpujobs.domain.naming import job_prefix
from tpujobs.domain.quotas import QuotaBook
from tpujobs.domain.spec import JobSpec, SpecError, decode_spec
from tpujobs.domain.states import JobState
from tpujobs.engine import metric_events, process_log
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.admission import SubmitOutcome
from tpujobs.engine.jobs.journal import JobJournal
from tpujobs.engine.jobs.lifecycle import JobLifecycle
from tpujobs.engine.jobs.rejections import Rejections
from tpujobs.engine.jobs.vetting import Verdict, Vetting
from tpujobs.engine.owner_team import owner_team
from tpujobs.engine.ports import AccessPolicyReader, Clock, JobRecords, Teams
from tpujobs.engine.settings import Settings

log = logging.getLogger(__name__)


class Submission:
    """Creates a job from a vetted spec (once per job_id) and hands it to admission."""

    def __init__(
        self,
        store: JobRecords,
        settings: Settings,
        clock: Clock,
        vetting: Vetting,
        journal: JobJournal,
        rejections: Rejections,
        lifecycle: JobLifecycle,
        teams: Teams | None = None,
        access: AccessPolicyReader | None = None,
    ) -> None:
        """`teams`: config/teams, whence a job's team (None: no teams); `access`: whether
        config/policies trusts a topic's claimed owner with its team (None: it does not)."""
        self.store = store
        self.settings = settings
        self.clock = clock
        self.vetting = vetting
        self.journal = journal
        self.rejections = rejections
        self.lifecycle = lifecycle
        self.teams = teams
        self.access = access

    def completed(self, spec: JobSpec) -> JobSpec:
        """The spec with the deployment's VM defaults (`Vetting.completed`)."""
        return self.vetting.completed(spec)

    def vet(self, spec: JobSpec, *, owner_verified: bool) -> Verdict:
        """The one vetting of a submission (`Vetting.vet`), for the jobs API to answer with."""
        return self.vetting.vet(spec, owner_verified=owner_verified)

    def submit(self, message: InboundMessage) -> SubmitOutcome:
        """A job spec on tpujobs-submit becomes one job and one capacity request, at most once.
        Its `owner` is a claim nobody checked: the job records `owner_verified: false`."""
        if message.data is None:
            self.rejections.reject(message, message.undecodable)
            return SubmitOutcome("rejected", None, message.undecodable)
        try:
            spec = self.completed(decode_spec(message.data, message_id=message.message_id))
        except SpecError as error:
            self.rejections.reject(message, str(error))
            return SubmitOutcome("rejected", None, str(error))
        verdict = self.vet(spec, owner_verified=False)
        if verdict.refusal is not None:
            self.rejections.reject(message, verdict.refusal)
            return SubmitOutcome("rejected", spec.job_id, verdict.refusal)
        return self._accept(spec, "topic", lambda reason: self.rejections.reject(message, reason), verdict.quotas)

    def submit_verified(self, spec: JobSpec, quotas: QuotaBook | None = None) -> SubmitOutcome:
        """A job spec from the jobs API, whose `owner` is the caller its ID token proved.

        The caller has vetted it (`vet`) and answers with the verdict, so a refusal here never
        becomes a rejection document. `quotas`: as the vetting read them.
        """
        return self._accept(spec, "api", lambda reason: None, quotas)

    def _accept(
        self, spec: JobSpec, via: SubmittedVia, refuse: Callable[[str], None], quotas: QuotaBook | None = None
    ) -> SubmitOutcome:
        """Create the job (once per job_id) and admit it. Only the same owner's identical spec is a
        `duplicate`; a job_id held by another owner or another spec is refused (the API's 409).
        `quotas`: as read by the caller for this submission, else admission reads them."""
        assert spec.job_id is not None
        process_log.bind_job(spec.job_id)
        log_uri = f"gs://{self.settings.logs_bucket}/{job_prefix(spec.job_id, spec.service_account)}"
        job, first_event = new_job(
            spec,
            self.settings.default_zone,
            self.clock(),
            log_uri,
            via,
            owner_verified=via == "api",
            record_retention_days=self.settings.record_retention_days,
        )
        job = dataclasses.replace(job, team=self.team_of(spec.owner, owner_verified=job.owner_verified))
        if self.store.create(job, first_event):
            metric_events.emit(log, metric_events.submitted(job))
            self.journal.announce(job, first_event)
        else:
            existing = self.store.get(job.job_id)
            if existing is None:  # deleted between the two reads: treat as new next time
                return SubmitOutcome("duplicate", job.job_id, "job vanished during submission")
            if existing.spec != spec:  # another owner's job, or another job: never answered as ours
                reason = (
                    f"job_id {job.job_id!r} is taken by another job (another owner's, or one with a "
                    "different spec): a job_id names one job, so choose another"
                )
                refuse(reason)
                return SubmitOutcome("rejected", job.job_id, reason)
            if existing.state is not JobState.QUEUED:
                return SubmitOutcome("duplicate", job.job_id, f"job is already {existing.state.value}")
            job = existing  # an earlier delivery stopped half-way: finish its work
        return self.lifecycle.admit(job, quotas)

    def team_of(self, owner: str, *, owner_verified: bool) -> str:
        """The owner's team (`engine.owner_team`), read once a submission."""
        return owner_team(self.teams, self.access, owner, owner_verified=owner_verified)
