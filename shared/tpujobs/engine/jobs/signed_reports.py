"""Reports and notices from a job's hosts, decoded and believed only when signed for their attempt."""

from __future__ import annotations

from typing import Protocol

from tpujobs.domain import signing
from tpujobs.domain.job import Job
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.rejections import Rejections
from tpujobs.engine.messages import Report, ReportError, decode_report
from tpujobs.engine.ports import Clock, JobRecords, MessageRecords
from tpujobs.engine.worker_reports import SignedReport


class _ReportStore(JobRecords, MessageRecords, Protocol):
    """The job, to check a report against, and the digests of the reports seen."""


class SignedReports:
    """Decodes a host's message and checks its signature, host, time and novelty."""

    def __init__(self, store: _ReportStore, report_key: str, clock: Clock, rejections: Rejections) -> None:
        self.store = store
        self.report_key = report_key
        self.clock = clock
        self.rejections = rejections

    def decode(self, model: type[Report], message: InboundMessage) -> Report | None:
        """The message as `model`; None after recording a rejection when it is not one."""
        try:
            return decode_report(model, message.data)
        except ReportError as error:
            self.rejections.reject(message, message.undecodable or str(error))
            return None

    def believed(self, report: SignedReport, message: InboundMessage) -> Job | None:
        """The job, as read to check it, when a report or notice is what the hosts of the
        attempt it names said; else None.

        Signed with that attempt's key, from a host the job has, timed within the attempt,
        and not a replay (the same signed bytes under another message id; a redelivery
        keeps its id). Otherwise it changes nothing and is recorded as a rejection.
        """
        job = self.store.get(report.job_id)
        if job is None:
            self.rejections.reject(message, f"job_id {report.job_id!r}: no such job")
            return None
        signature = message.attributes.get(signing.SIGNATURE_ATTRIBUTE)
        now = self.clock()
        problem = signing.report_problem(
            job,
            attempt=report.attempt,
            slice_id=report.slice_id,
            worker_id=report.worker_id,
            at=report.at,
            data=message.data or b"",
            signature=signature,
            master=self.report_key,
            now=now,
        )
        if problem is None:
            assert signature is not None
            first = self.store.remember_report(
                signing.report_digest(signature), message.message_id, report.job_id, report.attempt, now
            )
            if first != message.message_id:
                problem = f"it is a replay: the same signed report arrived before as message {first}"
        if problem is not None:
            self.rejections.reject(message, f"Report for {report.job_id} attempt {report.attempt} refused: {problem}.")
            return None
        return job
