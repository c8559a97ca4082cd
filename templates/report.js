// Progressive enhancement: sorting and filtering the findings table. The page is complete without it.
(function () {
  document.documentElement.classList.add("js");
  var table = document.getElementById("findings");
  if (!table) { return; }
  var body = table.tBodies[0];
  var headers = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(headers, function (th, index) {
    var button = th.querySelector("button");
    if (!button) { return; }
    button.addEventListener("click", function () {
      var ascending = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(headers, function (h) { if (h.hasAttribute("aria-sort")) { h.setAttribute("aria-sort", "none"); } });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      var numeric = th.dataset.type === "number" || th.dataset.type === "rank";
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[index].dataset.sort || a.cells[index].textContent.trim();
        var y = b.cells[index].dataset.sort || b.cells[index].textContent.trim();
        var order = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
  var text = document.getElementById("filter");
  var severity = document.getElementById("severity");
  function apply() {
    var needle = text.value.toLowerCase();
    Array.prototype.forEach.call(body.rows, function (row) {
      var visible = (!needle || row.textContent.toLowerCase().indexOf(needle) >= 0) &&
                    (!severity.value || row.dataset.severity === severity.value);
      row.hidden = !visible;
    });
  }
  text.addEventListener("input", apply);
  severity.addEventListener("change", apply);
})();
