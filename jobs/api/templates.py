"""API of job templates, under /api/v1/job-templates/: one view per operation."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import can_act, request_user
from core.api import CursorPagination
from core.errors import FieldError
from core.permissions import IsResearcherOrOperator
from jobs.api.jobs import AcceptedSerializer, JobInputSerializer, accepted
from jobs.compose.templates import (
    job_template_create,
    job_template_delete,
    job_template_get_for_user,
    job_template_list_for_user,
    job_template_submit,
    job_template_update,
)
from jobs.models import JobTemplate
from nodes.models import Cluster


class JobTemplateSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True, allow_null=True)
    job = serializers.JSONField(
        source="settings", read_only=True, help_text="the submit body it holds (no cluster)"
    )
    can_edit = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()

    class Meta:
        model = JobTemplate
        fields = [
            "id",
            "name",
            "description",
            "shared",
            "owner",
            "cluster",
            "job",
            "source_job",
            "can_edit",
            "url",
            "created_at",
            "updated_at",
        ]

    def get_can_edit(self, template: JobTemplate) -> bool:
        """The caller may change or delete it (its owner, or an operator)."""
        request = self.context.get("request")
        return request is not None and can_act(request.user, owner_id=template.owner_id)

    def get_url(self, template: JobTemplate) -> str:
        return reverse("api:job-template-detail", args=[template.pk])


def _cluster_named(name: str | None) -> Cluster:
    if name:
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            raise FieldError("job.cluster", f"no cluster named {name!r}")
        return cluster
    cluster = Cluster.objects.filter(is_default=True).first()
    if cluster is None:
        raise FieldError("job.cluster", "no default cluster; name one")
    return cluster


def _settings_from(job_body: dict[str, Any], cluster: Cluster) -> dict[str, Any]:
    """A validated submit body as a template's settings (the cluster is kept apart)."""
    values = dict(job_body)
    values.pop("cluster", None)
    preset = values.pop("preset", None)
    if preset:
        values["config"] = {"preset": preset, **(values.get("config") or {})}
    values["partition"] = values.get("partition") or cluster.default_partition
    values.setdefault("tasks_per_node", None)
    return values


class TemplatePagination(CursorPagination):
    ordering = "-pk"


class JobTemplateListApi(generics.ListAPIView):
    """Templates you may see: yours and the shared ones (operators: all)."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = JobTemplateSerializer
    pagination_class = TemplatePagination
    filter_backends: list[Any] = []

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return job_template_list_for_user(user=request_user(self.request))


class JobTemplateCreateApi(APIView):
    """Keep a job's settings as a template: ``job`` is a submit body, as
    ``POST /api/v1/jobs/submit/`` takes it; checked against the cluster as a submit is."""

    permission_classes = [IsResearcherOrOperator]

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=128)
        description = serializers.CharField(
            max_length=512, required=False, allow_blank=True, default=""
        )
        shared = serializers.BooleanField(default=False, help_text="everyone may see and use it")
        job = JobInputSerializer()

    @extend_schema(request=InputSerializer, responses={201: JobTemplateSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        cluster = _cluster_named(values["job"].get("cluster"))
        settings = _settings_from(values["job"], cluster)
        template = job_template_create(
            user=request_user(request),
            name=values["name"],
            description=values["description"],
            shared=values["shared"],
            cluster=cluster,
            settings=settings,
        )
        body = JobTemplateSerializer(template, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


class JobTemplateDetailApi(APIView):
    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=JobTemplateSerializer)
    def get(self, request: Request, template_id: int) -> Response:
        template = job_template_get_for_user(user=request_user(request), template_id=template_id)
        return Response(JobTemplateSerializer(template, context={"request": request}).data)


class JobTemplateUpdateApi(APIView):
    """Change a template (its owner or an operator): only the keys sent change."""

    permission_classes = [IsResearcherOrOperator]

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=128, required=False)
        description = serializers.CharField(max_length=512, required=False, allow_blank=True)
        shared = serializers.BooleanField(required=False)
        job = JobInputSerializer(required=False, help_text="replaces the settings (same cluster)")

    @extend_schema(request=InputSerializer, responses=JobTemplateSerializer)
    def post(self, request: Request, template_id: int) -> Response:
        template = job_template_get_for_user(user=request_user(request), template_id=template_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        settings = None
        if "job" in values:
            if template.cluster is None:
                raise FieldError("job", "the template's cluster was removed; make a new template")
            named = values["job"].get("cluster")
            if named and named != template.cluster.name:
                raise FieldError("job.cluster", "a template keeps its cluster; make a new one")
            settings = _settings_from(values["job"], template.cluster)
        template = job_template_update(
            actor=request_user(request),
            template=template,
            name=values.get("name"),
            description=values.get("description"),
            shared=values.get("shared"),
            settings=settings,
        )
        return Response(JobTemplateSerializer(template, context={"request": request}).data)


class JobTemplateDeleteApi(APIView):
    """Delete a template (its owner or an operator). Jobs made from it stay."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request, template_id: int) -> Response:
        template = job_template_get_for_user(user=request_user(request), template_id=template_id)
        job_template_delete(actor=request_user(request), template=template)
        return Response(status=status.HTTP_204_NO_CONTENT)


class JobTemplateSubmitApi(APIView):
    """Submit a job with a template's settings, as you (202: poll ``poll``). Someone
    else's template that sets environment variables needs ``confirm_environment``: the
    template's ``job.environment``, sent back unchanged (400 otherwise)."""

    permission_classes = [IsResearcherOrOperator]

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(
            max_length=128, required=False, help_text="the job's name; default: the template's"
        )
        confirm_environment = serializers.DictField(
            child=serializers.CharField(allow_blank=True, trim_whitespace=False),
            required=False,
            help_text="the environment variables your job gets from the template, as you "
            "read them (its job.environment); required for someone else's template that "
            "sets any",
        )

    @extend_schema(request=InputSerializer, responses={202: AcceptedSerializer})
    def post(self, request: Request, template_id: int) -> Response:
        template = job_template_get_for_user(user=request_user(request), template_id=template_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = job_template_submit(
            user=request_user(request),
            template=template,
            name=data.validated_data.get("name"),
            confirm_environment=data.validated_data.get("confirm_environment"),
        )
        return accepted(job)
