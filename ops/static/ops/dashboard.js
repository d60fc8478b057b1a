// The staff dashboard (/ops/): draws the charts from the snapshot embedded in the page, then
// fetches /ops/data/ every few seconds and redraws them, the tiles and the tables. The server
// formats every number shown as text; this script only places it.
(function () {
  "use strict";

  const root = document.getElementById("content-main");
  const embedded = document.getElementById("ops-data");
  if (!root || !embedded || typeof Chart === "undefined") return;

  let data = JSON.parse(embedded.textContent);
  const colors = data.colors;
  const status = document.getElementById("ops-status");
  const charts = {};

  function themeDefaults() {
    const css = getComputedStyle(document.documentElement);
    Chart.defaults.color = css.getPropertyValue("--body-quiet-color").trim() || "#666";
    Chart.defaults.borderColor = css.getPropertyValue("--hairline-color").trim() || "#e8e8e8";
    Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
  }
  themeDefaults();
  Chart.defaults.animation = false; // a refresh replaces the data; nothing to animate
  Chart.defaults.maintainAspectRatio = false;
  Chart.defaults.plugins.legend.labels.boxWidth = 12;
  Chart.defaults.plugins.legend.position = "bottom";

  // Writes a note across a chart that has nothing to show (the axes alone look like a fault).
  const emptyNote = {
    id: "emptyNote",
    afterDraw(chart, _args, options) {
      const any = chart.data.datasets.some((set) => set.data.some((value) => value > 0));
      if (any || !options.text) return;
      const { ctx, chartArea } = chart;
      ctx.save();
      ctx.fillStyle = Chart.defaults.color;
      ctx.font = `13px ${Chart.defaults.font.family}`;
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillText(options.text, (chartArea.left + chartArea.right) / 2, (chartArea.top + chartArea.bottom) / 2);
      ctx.restore();
    },
  };
  Chart.register(emptyNote);

  // Legend entries only for series with something in them.
  const legendOfNonEmpty = {
    labels: { filter: (item, chartData) => chartData.datasets[item.datasetIndex].data.some((v) => v > 0) },
  };
  const countAxis = { beginAtZero: true, ticks: { precision: 0 } };

  function bars(label, values, color, extra) {
    return Object.assign({ label, data: values, backgroundColor: color, borderWidth: 0, maxBarThickness: 56 },
      extra || {});
  }

  function chart(id, config) {
    const canvas = document.getElementById(id);
    if (canvas) charts[id] = new Chart(canvas, config);
  }

  const JOB_ORDER = ["completed", "failed", "cancelled", "processing", "pending", "paused", "waiting"];

  function jobsConfig(d) {
    const perMinute = d.jobs_per_minute;
    return {
      type: "bar",
      data: {
        labels: perMinute.labels,
        datasets: JOB_ORDER.map((name) => bars(name, perMinute.series[name], colors[name])),
      },
      options: {
        scales: {
          x: { stacked: true, grid: { display: false }, ticks: { maxTicksLimit: 13, maxRotation: 0 } },
          y: Object.assign({ stacked: true }, countAxis),
        },
        plugins: { legend: legendOfNonEmpty, emptyNote: { text: "No job changed status in the last hour" } },
      },
    };
  }

  function durationsConfig(d) {
    const durations = d.durations;
    return {
      type: "bar",
      data: {
        labels: durations.buckets,
        datasets: [
          bars("completed", durations.series.completed, colors.completed),
          bars("failed", durations.series.failed, colors.failed),
        ],
      },
      options: {
        scales: { x: { grid: { display: false } }, y: countAxis },
        plugins: { emptyNote: { text: "No job finished in the last hour" } },
      },
    };
  }

  function backlogConfig(d) {
    const questions = d.questions;
    return {
      type: "bar",
      data: {
        labels: d.jobs_per_minute.labels,
        datasets: [
          { type: "line", label: "open", data: questions.backlog, borderColor: colors.questions,
            backgroundColor: colors.questions, borderWidth: 2, pointRadius: 0, stepped: "after", order: 0 },
          bars("opened", questions.opened, colors.questions_opened, { order: 1 }),
          bars("closed", questions.closed, colors.questions_closed, { order: 1 }),
        ],
      },
      options: {
        scales: { x: { grid: { display: false }, ticks: { maxTicksLimit: 7, maxRotation: 0 } }, y: countAxis },
        plugins: { emptyNote: { text: "No open questions" } },
      },
    };
  }

  function agesConfig(ages, label, color, empty) {
    return {
      type: "bar",
      data: { labels: ages.buckets, datasets: [bars(label, ages.counts, color)] },
      options: {
        scales: { x: { grid: { display: false } }, y: countAxis },
        plugins: { legend: { display: false }, emptyNote: { text: empty } },
      },
    };
  }

  function waitsConfig(d) {
    const services = d.waits.services;
    return {
      type: "bar",
      data: {
        labels: services.map((row) => row.service),
        datasets: [
          bars("submitting", services.map((row) => row.submitting), colors.submitting),
          bars("waiting", services.map((row) => row.waiting), colors.waiting),
        ],
      },
      options: {
        indexAxis: "y",
        scales: { x: Object.assign({ stacked: true }, countAxis), y: { stacked: true, grid: { display: false } } },
        plugins: { emptyNote: { text: "No active waits" } },
      },
    };
  }

  function configs(d) {
    return {
      "chart-jobs": jobsConfig(d),
      "chart-durations": durationsConfig(d),
      "chart-backlog": backlogConfig(d),
      "chart-question-ages": agesConfig(d.questions.ages, "open questions", colors.questions, "No open questions"),
      "chart-waits": waitsConfig(d),
      "chart-wait-ages": agesConfig(d.waits.ages, "active waits", colors.waiting, "No active waits"),
    };
  }

  function valueAt(path, d) {
    return path.split(".").reduce((value, key) => (value == null ? value : value[key]), d);
  }

  function fillTable(id, rows, columns, emptyText) {
    const body = document.querySelector(`#${id} tbody`);
    if (!body) return;
    const fresh = document.createElement("tbody");
    if (!rows.length) {
      const tr = fresh.insertRow();
      tr.className = "ops-empty";
      const td = tr.insertCell();
      td.colSpan = columns.length;
      td.textContent = emptyText;
    }
    for (const row of rows) {
      const tr = fresh.insertRow();
      columns.forEach((name, index) => {
        const td = tr.insertCell();
        td.textContent = row[name] == null ? "–" : String(row[name]);
        if (index > 0) td.className = "num";
      });
    }
    body.replaceWith(fresh);
  }

  function render(d) {
    for (const tile of d.tiles) {
      const box = root.querySelector(`[data-tile="${tile.key}"]`);
      if (!box) continue;
      box.querySelector(".ops-tile-value").textContent = tile.text;
      box.querySelector(".ops-tile-label").textContent = tile.label;
      box.classList.toggle("ops-alert", tile.alert);
    }
    for (const element of root.querySelectorAll("[data-value]")) {
      const value = valueAt(element.dataset.value, d);
      element.textContent = value == null ? "–" : String(value);
    }
    const noneFinished = `No job finished in the last ${d.window_minutes} minutes.`;
    fillTable("table-kinds", d.durations.kinds, ["kind", "count", "failed", "p50_text", "p95_text", "max_text"],
      noneFinished);
    fillTable("table-services", d.waits.services,
      ["service", "submitting", "waiting", "oldest_age_text", "next_due_text"], "No active waits.");
    fillTable("table-wakes", d.waits.wake_latency.by, ["by", "count", "p50_text", "p95_text"],
      `No wakes in the last ${d.window_minutes} minutes.`);
    themeDefaults();
    for (const [id, config] of Object.entries(configs(d))) {
      const existing = charts[id];
      if (!existing) {
        chart(id, config);
        continue;
      }
      existing.data.labels = config.data.labels;
      config.data.datasets.forEach((set, index) => {
        if (existing.data.datasets[index]) existing.data.datasets[index].data = set.data;
      });
      existing.update();
    }
  }

  let timer = null;
  async function refresh() {
    if (document.hidden) return;
    try {
      const response = await fetch(root.dataset.url, {
        headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store",
      });
      const json = response.ok && (response.headers.get("Content-Type") || "").includes("application/json");
      if (!json) {
        // Signed out (the admin's login page answered) or no longer staff: stop asking.
        clearInterval(timer);
        status.textContent = "Not refreshing: sign in again and reload the page.";
        status.classList.add("ops-error");
        return;
      }
      data = await response.json();
      render(data);
      status.textContent = "";
      status.classList.remove("ops-error");
      root.dataset.refreshedAt = data.generated_at;
    } catch (error) {
      status.textContent = "The server did not answer; trying again.";
      status.classList.add("ops-error");
    }
  }

  render(data);
  root.dataset.ready = "true";
  timer = setInterval(refresh, (Number(root.dataset.refresh) || 10) * 1000);
  window.opsDashboard = { charts, refresh };
})();
