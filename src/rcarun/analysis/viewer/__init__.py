"""The trajectory viewer of `rcarun report --html DIR`: static pages that show one failed trajectory at a time.

The aggregate report says how often each backbone and method finds the root cause; a person debugging a method
needs the opposite view: one trajectory, its steps, the reference root and every backbone × method ×
realization verdict on the same step axis, with the calls (and their prompt and answer text) behind each. The
site works from ``file://`` with no server, CDN or external font, so it can be zipped, mailed or opened on a
machine without a network.

Layout (``DIR`` as given to ``--html``):

- ``index.html``: the aggregate report page (`rcarun.analysis.render.render_html`) with a link to the viewer;
- ``trajectories.html``: every trajectory of the run, filterable and sortable;
- ``t/<safe-qid>.html`` and ``t/<safe-qid>.data.js``: one trajectory's page, and its step contents and calls as
  a script assigning one global, rendered into the page only when a step or a call is opened;
- ``texts/<key[:2]>/<key>.js``: each prompt, answer, reasoning text, raw body and method output once,
  content-addressed, loaded by a ``<script>`` element when asked for (``fetch`` is refused on ``file://``);
- ``assets/viewer.css``, ``assets/viewer.js``; ``rcarun-site.json`` marks the folder as a site this writes.

Step contents are not in results.db (only roles and references are): they come from the dataset the run's
stored config names, used only where a record's SHA-256 is the one the run saw.
"""

from rcarun.analysis.viewer.site import SiteFiles, is_site_target, write_site

__all__ = ["SiteFiles", "is_site_target", "write_site"]
