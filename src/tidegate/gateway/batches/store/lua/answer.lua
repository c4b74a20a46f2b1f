-- Record the final outcome of ended lines of a batch, each written once: a line already
-- recorded (another gateway saw it end first, or saw its job while the queue still kept it)
-- keeps its answer. Harmless to run twice.
-- KEYS[1] tidegate:{name}:batch_answers:<batch id>  hash  custom_id -> answer
-- ARGV    custom_id, answer, custom_id, answer, ...
for i = 1, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
