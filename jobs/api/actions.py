"""API of one job, the rest: hold and release, run again, save as a template, and its
whole output (streamed, with HTTP range requests), under /api/v1/jobs/{id}/."""

from __future__ import annotations

from typing import Any

from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import request_user
from core.permissions import IsResearcherOrOperator
from jobs.api.jobs import AcceptedSerializer, RequestAcceptedSerializer, accepted, accepted_request
from jobs.api.templates import JobTemplateSerializer
from jobs.compose.templates import job_run_again, job_template_from_job
from jobs.output import job_output_response, job_rank_outputs
from jobs.pending_queue import job_hold, job_release
from jobs.selectors import job_get_for_user


class JobHoldApi(APIView):
    """Hold a job pending in Slurm (``scontrol hold``, sent by a worker as the job's
    account): it stays pending until released. Owner or operator; 409 unless the job is
    pending. 202 with ``request`` ("hold requested"): poll for Slurm's new reason."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(request=None, responses={202: RequestAcceptedSerializer})
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        return accepted_request(job, job_hold(actor=request_user(request), job=job))


class JobReleaseApi(APIView):
    """Release a held job (``scontrol release``, sent by a worker). Owner or operator;
    409 unless pending; 202 with ``request`` ("release requested")."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(request=None, responses={202: RequestAcceptedSerializer})
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        return accepted_request(job, job_release(actor=request_user(request), job=job))


class JobRunAgainApi(APIView):
    """A fresh job with this job's settings (not a resume), as you. 202: poll ``poll``."""

    permission_classes = [IsResearcherOrOperator]

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=128, required=False)

    @extend_schema(request=InputSerializer, responses={202: AcceptedSerializer})
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        new = job_run_again(
            user=request_user(request), job=job, name=data.validated_data.get("name")
        )
        return accepted(new)


class JobSaveTemplateApi(APIView):
    """Keep this job's settings as a template of yours (private unless ``shared``)."""

    permission_classes = [IsResearcherOrOperator]

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=128)
        description = serializers.CharField(
            max_length=512, required=False, allow_blank=True, default=""
        )
        shared = serializers.BooleanField(default=False)

    @extend_schema(request=InputSerializer, responses={201: JobTemplateSerializer})
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        template = job_template_from_job(user=request_user(request), job=job, **data.validated_data)
        body = JobTemplateSerializer(template, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


_RANGE = OpenApiParameter(
    "Range",
    str,
    location=OpenApiParameter.HEADER,
    required=False,
    description="one byte range: bytes=0-1023, bytes=4096- or bytes=-500",
)
_FILE_RESPONSES: dict[Any, Any] = {
    (200, "text/plain"): OpenApiResponse(OpenApiTypes.BINARY, description="the whole file"),
    (206, "text/plain"): OpenApiResponse(OpenApiTypes.BINARY, description="the range asked"),
    416: OpenApiResponse(description="the range is outside the file (Content-Range: */size)"),
}


class JobOutputApi(APIView):
    """The job's whole Slurm output (``slurm-<id>.out``), streamed from the cluster over
    SFTP. Honours ``Range`` (206 with ``Content-Range``; 416 for a range outside it)."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(parameters=[_RANGE], responses=_FILE_RESPONSES)
    def get(self, request: Request, job_id: str) -> HttpResponseBase:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        return job_output_response(job=job, rank=None, range_header=request.headers.get("Range"))


class JobRankOutputsApi(APIView):
    """The per-rank output files in the job's run directory, with their sizes."""

    permission_classes = [IsResearcherOrOperator]

    class OutputSerializer(serializers.Serializer):
        rank = serializers.IntegerField()
        name = serializers.CharField()
        size = serializers.IntegerField()

    @extend_schema(responses=OutputSerializer(many=True))
    def get(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        return Response(self.OutputSerializer(job_rank_outputs(job), many=True).data)


class JobRankOutputApi(APIView):
    """One rank's output (``rank-<slurm id>-<rank>.out``), streamed; ``Range`` as above."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(parameters=[_RANGE], responses=_FILE_RESPONSES)
    def get(self, request: Request, job_id: str, rank: int) -> HttpResponseBase:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        return job_output_response(job=job, rank=rank, range_header=request.headers.get("Range"))
