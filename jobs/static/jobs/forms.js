/* Small conveniences for the forms of the jobs pages, no build step. Everything works without
 * them: a select marked data-autosubmit submits its form when changed (the button that would
 * do it is then hidden). */
(function () {
  "use strict";
  function start() {
    document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
      var button = select.form && select.form.querySelector('[data-role="choose"]');
      if (button) button.hidden = true;
      select.addEventListener("change", function () { HTMLFormElement.prototype.submit.call(select.form); });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
