-- Two results.db files side by side: predictions (every field scoring reads) and the calls sent and answered.
--   sqlite3 BEFORE.db -cmd "attach 'AFTER.db' as b" < scripts/compare_runs.sql
select 'predictions before, after', (select count(*) from main.predictions), (select count(*) from b.predictions);
select 'predictions that differ', count(*) from (
  select backbone, method, qid, realization, pred_role, pred_step, role_valid, step_valid, abstained, output_json, fallback
  from main.predictions
  except
  select backbone, method, qid, realization, pred_role, pred_step, role_valid, step_valid, abstained, output_json, fallback
  from b.predictions);
select 'calls before, after', (select count(*) from main.calls), (select count(*) from b.calls);
select 'calls whose request or answer differ', count(*) from (
  select backbone, method, qid, realization, stage, attempt, status, request_sha256, response_text_sha256 from main.calls
  except
  select backbone, method, qid, realization, stage, attempt, status, request_sha256, response_text_sha256 from b.calls);
