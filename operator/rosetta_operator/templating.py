"""The jinja2 templates in templates/, rendered and read back as plain dicts. They only place
values; render.py and evaluation_job.py (over pod_builder.py) compute every one, and take what is
read back as the object, unedited.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import jinja2
import yaml

# libyaml when present: the pure-Python parser made YAML most of a reconcile's CPU time.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
    )
    # tojson's default escapes characters beyond the BMP (an emoji) as a surrogate pair, which YAML
    # cannot read back; written as themselves they are plain UTF-8.
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "ensure_ascii": False}
    return env


def render_template(template: str, **context: Any) -> dict[str, Any]:
    return cast(dict[str, Any], yaml.load(_env().get_template(template).render(**context), Loader=_Loader))
