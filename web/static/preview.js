// Live dry-run preview for the submit form: as the form changes, ask the server what
// submitting now would do and show its answer. Without JavaScript the Preview button does
// the same with a full page load.
"use strict";
(function () {
  const form = document.getElementById("submit-job");
  const target = document.getElementById("preview");
  if (!form || !target) return;
  let timer = null;
  let latest = 0;
  async function refresh() {
    const asked = ++latest;
    const body = new URLSearchParams(new FormData(form));
    try {
      const response = await fetch(form.dataset.preview, {
        method: "POST",
        body,
        credentials: "same-origin",
        headers: { "content-type": "application/x-www-form-urlencoded" },
      });
      // An older answer arriving late must not replace a newer one, and an expired session
      // (redirected to the sign-in page) must not put that page inside the form.
      if (response.ok && !response.redirected && asked === latest) {
        target.innerHTML = await response.text();
      }
    } catch (_) {
      // Offline or the server is restarting: the Preview button still works.
    }
  }
  function soon() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);
  }
  form.addEventListener("input", soon);
  form.addEventListener("change", soon);
})();
