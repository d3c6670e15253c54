from __future__ import annotations

from typing import Any

from drf_spectacular import openapi


class AutoSchema(openapi.AutoSchema):
    """Name nested ``InputSerializer``/``OutputSerializer`` classes after their view.

    Views follow the one-view-per-operation style with nested serializers; without this,
    every "Output" component would collide in the OpenAPI document.
    """

    def _get_serializer_name(
        self, serializer: Any, direction: str, bypass_extensions: bool = False
    ) -> str:
        name = super()._get_serializer_name(serializer, direction, bypass_extensions)
        serializer_class = serializer if isinstance(serializer, type) else type(serializer)
        qualname = serializer_class.__qualname__
        if "." in qualname:
            owner = qualname.split(".")[0]
            owner = owner.removesuffix("Api").removesuffix("View")
            name = owner + name
        return name
